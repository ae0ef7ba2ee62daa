"""Turn what huggingface_hub, httpx and the OS raise into HubErrors a person can act on."""

from __future__ import annotations

import errno
from dataclasses import dataclass, replace

from k3desk.core.errors import HubError
from k3desk.core.private import RefusedPath
from k3desk.core.safepaths import shown
from k3desk.core.units import fmt_bytes


@dataclass(frozen=True)
class Where:
    """What was being done when the error happened (for the message)."""

    repo: str
    endpoint: str
    revision: str = ""
    path: str = ""  # file in the repo
    local: str = ""  # file or folder on disk
    has_token: bool = False

    @property
    def repo_url(self) -> str:
        return f"{self.endpoint.rstrip('/')}/{self.repo}"


class RateLimited(HubError):
    """HTTP 429 from the Hub; ``retry_after`` in seconds when the server said."""

    def __init__(self, message: str, hint: str, retry_after: float | None) -> None:
        super().__init__(message, hint)
        self.retry_after = retry_after


TRANSPORT_ERRORS = frozenset(
    {
        "TransportError",
        "NetworkError",
        "TimeoutException",
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "ReadError",
        "WriteError",
        "PoolTimeout",
        "RemoteProtocolError",
        "ProtocolError",
        "ConnectionError",
        "TimeoutError",
        "ShortRead",
    }
)


# The server answered, but not in HTTP (or not as it promised): its fault, not the network's.
PROTOCOL_ERRORS = frozenset(
    {
        "RemoteProtocolError",
        "LocalProtocolError",
        "ProtocolError",
        "DecodingError",
        "TooManyRedirects",
        "BodyTooLong",
    }
)


# httpx reports a connection that closed mid-answer as a protocol error; it is a drop
_DROPPED = ("peer closed connection", "incomplete chunked read", "server disconnected")


def _dropped(exc: BaseException) -> bool:
    text = str(exc).lower()
    return bool(_names(exc) & {"RemoteProtocolError"}) and any(d in text for d in _DROPPED)


def _names(exc: BaseException) -> set[str]:
    """Class names of ``exc`` (a child process reports its error by name)."""
    child = getattr(exc, "child_error", None)
    if isinstance(child, str):
        return {child}
    return {c.__name__ for c in type(exc).__mro__}


def _status(exc: BaseException) -> int | None:
    if getattr(exc, "child_error", None) is not None:
        code = getattr(exc, "status", None)
        return code if isinstance(code, int) else None
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def _header(exc: BaseException, name: str) -> str | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get(name)
    return str(value) if value is not None else None


def retry_after_seconds(exc: BaseException) -> float | None:
    child = getattr(exc, "retry_after", None)
    if isinstance(child, int | float):
        return float(child)
    value = _header(exc, "Retry-After")
    if value is None:
        reset = _header(exc, "RateLimit")  # IETF draft: "...;r=0;t=37"
        if reset and "t=" in reset:
            try:
                return float(reset.rsplit("t=", 1)[1].split(";")[0])
            except ValueError:
                return None
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def is_disk_error(exc: BaseException) -> bool:
    """An OSError from the filesystem (huggingface_hub's HTTP errors are OSErrors too)."""
    if not isinstance(exc, OSError) or getattr(exc, "response", None) is not None:
        return False
    return not _names(exc) & (TRANSPORT_ERRORS | {"HfHubHTTPError", "OfflineModeIsEnabled"})


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt: network hiccups, timeouts, 408/429/5xx."""
    if _names(exc) & TRANSPORT_ERRORS:
        return True
    code = _status(exc)
    return code is not None and (code in (408, 429) or code >= 500)


def token_hint(where: Where, *, sentence: bool = True) -> str:
    text = (
        f"create a read token at {where.endpoint.rstrip('/')}/settings/tokens and set it "
        "in k3desk's Hugging Face settings or in the HF_TOKEN environment variable."
    )
    return text[0].upper() + text[1:] if sentence else text


def hub_error(exc: BaseException, where: Where) -> HubError:
    """The HubError for ``exc`` (returns ``exc`` itself if it already is one).

    The first that applies, in this order: the disk, the error's class (offline,
    gated, revision, entry), the HTTP status (with the repository's absence), how the
    connection failed, then any other status and the plain message.
    """
    if isinstance(exc, HubError):
        return exc
    # what the Hub named (a repository id, a file) is shown bounded, however long it is
    where = replace(where, repo=shown(where.repo, 120), path=shown(where.path, 160))
    if isinstance(exc, OSError) and is_disk_error(exc):
        return disk_error(exc, where)
    names = _names(exc)
    code = _status(exc)
    found = (
        _by_class(names, where)
        or _by_status(exc, names, code, where)
        or _by_transport(exc, names, where)
    )
    if found is not None:
        return found
    if code is not None:
        return HubError(
            f"The Hub answered HTTP {code} for {where.path or where.repo}.",
            "Run the download again; if it keeps failing, check the repository page "
            f"{where.repo_url}.",
        )
    return HubError(
        f"Downloading {where.path or where.repo} failed: {_plain(exc)}.",
        "Run the same download again to resume.",
    )


def _by_class(names: set[str], where: Where) -> HubError | None:
    """huggingface_hub's own errors that say what is wrong without a status."""
    rev = where.revision[:12] if len(where.revision) == 40 else where.revision
    if "OfflineModeIsEnabled" in names:
        return HubError(
            f"Cannot reach {where.endpoint}: HF_HUB_OFFLINE is set.",
            "Unset HF_HUB_OFFLINE to download.",
        )
    if "GatedRepoError" in names:
        if where.has_token:
            return HubError(
                f"{where.repo} is a gated repository and this account has not been granted "
                "access (its licence or access conditions have not been accepted).",
                f"Open {where.repo_url} while signed in, accept the conditions, wait for "
                "approval if the author reviews requests, then run the download again.",
            )
        return HubError(
            f"{where.repo} is a gated repository: downloading it needs a Hugging Face token "
            "from an account that accepted its conditions.",
            f"Accept the conditions at {where.repo_url}, then " + token_hint(where, sentence=False),
        )
    if "RevisionNotFoundError" in names:
        return HubError(
            f"Revision '{rev}' does not exist in {where.repo}.",
            f"Check the branch, tag or commit at {where.repo_url}/commits/main, "
            "or leave --revision out to use main.",
        )
    if names & {"RemoteEntryNotFoundError", "EntryNotFoundError"}:
        return HubError(
            f"'{where.path}' is not in {where.repo} at revision {rev}.",
            "The repository changed since the catalog was written; "
            f"see {where.repo_url}/tree/main for its files.",
        )
    return None


def _by_status(
    exc: BaseException, names: set[str], code: int | None, where: Where
) -> HubError | None:
    """The statuses that say what to do: a token, the repository, a wait, later."""
    if (
        code == 401
        and (where.has_token or "Invalid credentials" in (_header(exc, "X-Error-Message") or ""))
        and "RepositoryNotFoundError" not in names
    ):
        return HubError(
            f"The Hub rejected the token (401 Unauthorized) for {where.repo}: "
            "it is invalid, expired or revoked.",
            token_hint(where),
        )
    if "RepositoryNotFoundError" in names:
        if where.has_token:
            return HubError(
                f"Repository {where.repo} was not found on {where.endpoint} "
                "(or it is private and this token cannot see it).",
                "Check the repo id for typos; for a private repo use a token of an account "
                "with access.",
            )
        return HubError(
            f"Repository {where.repo} was not found on {where.endpoint} "
            "(it does not exist, or it is private and no token was given).",
            "Check the repo id for typos; for a private repo, " + token_hint(where, sentence=False),
        )
    if code == 401:
        return HubError(
            f"The Hub asked for authentication (401) to read {where.repo}.",
            token_hint(where),
        )
    if code == 403:
        return HubError(
            f"The Hub refused access to {where.repo} (403 Forbidden).",
            "Make sure your token has read permission for this repository. " + token_hint(where),
        )
    if code == 429:
        wait = retry_after_seconds(exc)
        when = f"in {wait:.0f} s" if wait is not None else "in a few minutes"
        return RateLimited(
            f"The Hub is rate-limiting this machine (429 Too Many Requests) while fetching "
            f"{where.path or where.repo}.",
            f"Nothing is lost: run the same download again {when}"
            + (" (signed-in users get higher limits)." if not where.has_token else "."),
            wait,
        )
    if code is not None and code >= 500:
        return HubError(
            f"The Hub answered HTTP {code} for {where.path or where.repo}: "
            "the server had a problem.",
            "Partial files are kept; run the same download again later to resume.",
        )
    if code == 416:
        return HubError(
            f"The server refused the byte range asked for {where.path} (416).",
            "Run the download again; the partial file will be re-checked.",
        )
    return None


def _by_transport(exc: BaseException, names: set[str], where: Where) -> HubError | None:
    """A connection that broke off, a server that broke the protocol, a Hub out of reach."""
    if "ShortRead" in names or _dropped(exc):
        return HubError(
            f"The transfer of {where.path or where.repo} from {where.endpoint} kept breaking off "
            f"({_plain(exc)}).",
            "Check the network connection; partial files are kept and the download resumes "
            "when run again.",
        )
    if names & PROTOCOL_ERRORS:
        return HubError(
            f"The server at {where.endpoint} broke the HTTP protocol while sending "
            f"{where.path or where.repo}: {_plain(exc)}.",
            "The server, or a proxy between you and it, misbehaves: check HF_ENDPOINT and "
            "proxy settings (HTTPS_PROXY). Partial files are kept; the download resumes when "
            "run again.",
        )
    if names & {"ReadTimeout", "WriteTimeout"}:  # connected, then no answer in time
        return HubError(
            f"The Hub at {where.endpoint} stopped answering the request for "
            f"{where.path or where.repo} ({_plain(exc)}).",
            "The Hub (or the mirror or proxy in HF_ENDPOINT / HTTPS_PROXY) is stuck or the "
            "network is; try again later. Partial files are kept.",
        )
    if names & TRANSPORT_ERRORS:
        return HubError(
            f"Cannot reach the Hub at {where.endpoint}: {_plain(exc)}.",
            "Check the network connection, proxy settings (HTTPS_PROXY) or HF_ENDPOINT; "
            "partial files are kept and the download resumes when run again.",
        )
    return None


def _plain(exc: BaseException) -> str:
    """The first line of what ``exc`` says (a server's message, often), bounded."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return shown(first, 300) or type(exc).__name__


def disk_error(exc: OSError, where: Where, *, kept: int = 0) -> HubError:
    if isinstance(exc, RefusedPath):  # a planted link or another user's folder, named
        return HubError(exc.message, exc.hint)
    target = where.local or exc.filename or "the target folder"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        keep = f" The partial download ({fmt_bytes(kept)}) is kept." if kept else ""
        return HubError(
            f"The disk holding {target} is full (while writing {where.path or 'a file'}).{keep}",
            "Free some space (or choose another folder) and run the same download again "
            "to resume where it stopped.",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return HubError(
            f"Permission denied writing to {target}.",
            "Choose a folder you can write to (--to DIR), or fix its ownership/permissions.",
        )
    if exc.errno == errno.EROFS:
        return HubError(
            f"{target} is on a read-only filesystem.",
            "Choose a folder on a writable disk (--to DIR).",
        )
    if exc.errno == errno.EFBIG:
        return HubError(
            f"The filesystem holding {target} cannot store a file this large "
            f"({where.path}); FAT32/vfat stops at 4 GiB.",
            "Use a disk formatted with ext4, XFS, btrfs, NTFS, APFS or exFAT.",
        )
    return HubError(
        f"Could not write {target}: {exc.strerror or exc}.",
        "Check the disk and the folder, then run the same download again.",
    )
