"""The wizard's tiers step: every tier judged for the machine (or for the cluster and its
engine), the pick preselected, the selected tier's details."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QSplitter, QTextBrowser

from k3desk.core.app.cluster_tiers import SPARKINFER_ONLY, ClusterTierRow, cluster_pick
from k3desk.core.app.presenters.hub_sets import hub_set_details
from k3desk.core.app.search import SetRow
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierJudgement, TierRow
from k3desk.core.app.values import K3Error
from k3desk.ui.judged import JudgedBar
from k3desk.ui.tiers import TierTable
from k3desk.ui.widgets import Banner, ElidedLabel, keep_rows, label
from k3desk.ui.wizard.base import StepPage
from k3desk.ui.wizard.hubsets import HubSetsBox

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import LaunchChoice
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard

CLUSTER_ORDER_RULE = (
    "Same quality order as for one machine. The verdict is the engine's own refusals and "
    "the cluster's memory plan from the probe."
)


class TiersPage(StepPage):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        super().__init__(
            ctx,
            wizard,
            "Tiers",
            "Every published Kimi-K3 quantization, judged for this machine. "
            "The recommended one is preselected.",
        )
        self.judged_bar = JudgedBar(ctx)
        self.lay.addWidget(self.judged_bar)
        self.reason = label("Planning…")
        self.reason.setObjectName("recommendation")
        self.lay.addWidget(self.reason)
        self.table = TierTable()
        keep_rows(self.table, 3)  # on a small screen the step scrolls; the rows stay
        # the catalog's tiers above the Hub's sets; the divider moves
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.setChildrenCollapsible(False)
        self.split.addWidget(self.table)
        self.lay.addWidget(self.split, 1)
        self.details = QTextBrowser()
        self.details.setObjectName("tierDetails")
        self.details.setMaximumHeight(150)
        self.details.setOpenExternalLinks(True)
        self.lay.addWidget(self.details)
        self.fit_warning = Banner()
        self.fit_warning.setObjectName("fitWarning")
        self.lay.addWidget(self.fit_warning)
        # what the Hub has now, beside the catalog (searched in the background)
        self.hub = HubSetsBox(ctx)
        self.hub.set_selected.connect(self._hub_selected)
        self.hub.download_wanted.connect(self._hub_download)
        wizard.finished.connect(lambda _r: self.hub.cancel())
        keep_rows(self.hub.table, 2)
        self.split.addWidget(self.hub)
        self.split.setStretchFactor(0, 1)
        self.split.setStretchFactor(1, 1)
        self.chosen_hub: SetRow | None = None  # a set of the Hub chosen instead of a tier
        row = QHBoxLayout()
        # the whole ordering rule in its tooltip: one line, elided (see the Models page)
        self.rule = ElidedLabel("", "tierRule")
        self.rule.setProperty("muted", True)
        row.addWidget(self.rule, 1)
        self.have = QPushButton("I already have the files…")
        self.have.setObjectName("tiersHaveFiles")
        self.have.setToolTip("Add the GGUF files you have to My models instead of downloading")
        self.have.clicked.connect(wizard.have_files)
        row.addWidget(self.have)
        self.lay.addLayout(row)
        self.other = self.judged_bar.other  # "Plan for other hardware…" (one machine only)
        self.table.tier_selected.connect(self._selected)
        self.shown = ""  # what the table judges: "machine" or "cluster:<name>:<engine>"

    def initializePage(self) -> None:
        wiz = self.wiz
        key = wiz.plan_key()
        keep = self.table.current() if key == self.shown else None
        if wiz.cluster_mode:
            self.setSubTitle(
                "Every published Kimi-K3 quantization, judged for the cluster and its engine. "
                "The one that runs best there is preselected."
            )
            self.show_cluster()
            self.hub.hide()
        else:
            self.setSubTitle(
                "Every published Kimi-K3 quantization, judged for the machine named below, "
                "and below them the sets the Hub has now. The recommended one is preselected."
            )
            self.judged_bar.show_cluster(None)
            judged = wiz.hardware.judgement
            if key != self.shown and judged is not None:
                self.show_judgement(judged)
            self.hub.show()
            self.search_hub()
        if keep is not None:
            self.table.select_tier(keep.tier.id)
        self._select_wanted()

    def _select_wanted(self) -> None:
        """The tier chosen where the wizard was opened from, once, over the recommended."""
        wanted = self.wiz.wanted_tier
        if wanted and any(r.tier.id == wanted for r in self.table.rows):
            self.table.select_tier(wanted)
            self.wiz.wanted_tier = ""

    def show_judgement(self, judged: TierJudgement) -> None:
        self.shown = "machine"
        self.reason.setText(judged.summary)
        self.rule.setText(judged.ordering_rule)
        self.rule.setToolTip(judged.ordering_rule)
        self.table.set_judgement(judged)
        self._select_wanted()
        if self.wiz.currentPage() is self and not self.wiz.cluster_mode:
            self.search_hub()  # another machine judged here: the Hub's sets judged for it
        self.completeChanged.emit()

    def search_hub(self) -> None:
        """Search the Hub for the machine the step judges, unless done (or under way)."""
        hw = self.ctx.hardware.from_file
        if self.hub.searched_for != hw:
            self.hub.search(hw)

    def show_cluster(self) -> None:
        """Judge every tier for the wizard's cluster and engine (the core's assessment)."""
        wiz = self.wiz
        view = wiz.cluster.view
        name = view.current_name() or ""
        choice = view.choice()
        judged = wiz.hardware.judgement
        tiers = (
            [r.tier for r in judged.rows]
            if judged is not None
            else list(self.ctx.services.catalog.tiers)
        )
        self.shown = wiz.plan_key()
        self.judged_bar.show_cluster(Subject.cluster(name, choice.engine))
        try:
            rows = view.controller.judge_tiers(name, choice, tiers)
        except K3Error as exc:
            self.reason.setText(f"{exc.message} {exc.hint}".strip())
            self.table.set_cluster([], None)
            self.completeChanged.emit()
            return
        best = cluster_pick(rows)
        self.table.set_cluster(rows, best)
        self.reason.setText(cluster_summary(name, choice, rows, best))
        self.rule.setText(CLUSTER_ORDER_RULE)
        self.rule.setToolTip(CLUSTER_ORDER_RULE)
        self.completeChanged.emit()

    def _selected(self, row: TierRow | ClusterTierRow) -> None:
        self.chosen_hub = None  # a tier instead of a set of the Hub
        self.hub.clear_selection()
        if isinstance(row, ClusterTierRow):
            self._selected_on_cluster(row)
            return
        t = row.tier
        tv = row.verdict
        esc = html.escape
        lines = [
            f"<b>{esc(t.name)}</b> by {esc(t.publisher)} · "
            f"<a href='https://huggingface.co/{t.repo}'>{esc(t.repo)}</a>",
            f"<p>{esc(row.label)}. {esc(tv.reason)}</p>",
        ]
        if tv.why_not and row.recommended:  # preselected as the closest, not recommended
            lines.append(
                f"<p><i>Nothing fits {esc(self.wiz.hardware.describe())}; the closest "
                f"option: {esc(tv.why_not)}</i></p>"
            )
        elif tv.why_not:
            lines.append(f"<p><i>Not recommended: {esc(tv.why_not)}</i></p>")
        if tv.plan is not None and tv.plan.notes:
            lines.append(
                "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in tv.plan.notes[:4]) + "</ul>"
            )
        if row.files_note:
            lines.append(
                f"<p><b>{esc(row.files_note)}</b> "
                "The download takes whatever its patterns match and checks what it can.</p>"
            )
        if row.basis_text:
            lines.append(f"<p>Its rank rests on: {esc(row.basis_text)}.</p>")
        if t.quality_caveat:
            lines.append(f"<p>Quality figures (*): {esc(t.quality_caveat)}</p>")
        if t.caveats:
            lines.append("<p>" + esc(" ".join(t.caveats[:2])) + "</p>")
        self.details.setHtml("".join(lines))
        self.fit_warning.show_text(esc(fit_warning(row, self.wiz.hardware.describe())))
        self.completeChanged.emit()

    def _selected_on_cluster(self, row: ClusterTierRow) -> None:
        t = row.tier
        a = row.assessment
        esc = html.escape
        lines = [
            f"<b>{esc(t.name)}</b> by {esc(t.publisher)} · "
            f"<a href='https://huggingface.co/{t.repo}'>{esc(t.repo)}</a>",
            f"<p>{esc(a.title)}: {esc(row.label)}</p>",
        ]
        if a.refusals:
            lines.append("<ul>" + "".join(f"<li>✗ {esc(r)}</li>" for r in a.refusals) + "</ul>")
        if a.warnings:
            lines.append("<ul>" + "".join(f"<li>! {esc(w)}</li>" for w in a.warnings) + "</ul>")
        if a.plan is not None:
            lines.append("<p>" + " ".join(esc(n) for n in a.plan.notes) + "</p>")
        if t.quality_caveat:
            lines.append(f"<p>Quality figures (*): {esc(t.quality_caveat)}</p>")
        self.details.setHtml("".join(lines))
        self.fit_warning.show_text("")
        # the cluster step checks the copies of the tier chosen here
        combo = self.wiz.cluster.view.tier
        combo.setCurrentIndex(max(0, combo.findData(t.id)))
        self.completeChanged.emit()

    def _hub_selected(self, row: SetRow | None) -> None:
        """A set of the Hub chosen: it is what the next steps download and run."""
        if row is None:
            if self.chosen_hub is not None:
                self.chosen_hub = None
                self.details.setHtml("")
            self.completeChanged.emit()
            return
        self.chosen_hub = row
        self.table.clearSelection()
        esc = html.escape
        lines = hub_set_details(row)
        self.details.setHtml(
            f"<b>{esc(lines[0])}</b><br>" + "<br>".join(esc(line) for line in lines[1:])
        )
        self.fit_warning.show_text("")
        self.completeChanged.emit()

    def _hub_download(self, row: SetRow) -> None:
        """A set's Download button: chosen (``_hub_selected``), the wizard goes on to
        where it lands and then downloads it, its projector with it."""
        if self.chosen_hub is row and self.wiz.currentPage() is self:
            self.wiz.next()

    def isComplete(self) -> bool:
        return self.table.current() is not None or self.chosen_hub is not None


def fit_warning(row: TierRow, machine: str) -> str:
    """A tier that does not fit in memory: the numbers and the choices (Next stays open)."""
    if row.fits:
        return ""
    short = [n.text() for n in row.needs if not n.fits]
    numbers = f" ({'; '.join(short)})" if short else ""
    # streaming is offered only where the plan says it can stream (the weights mapped
    # from disk); a tier that cannot even do that is for a larger machine
    why = (
        "to download it for a larger machine, or to stream it from disk, slowly"
        if row.kind == "stream"
        else "to download it for a larger machine: it cannot run here, not even from disk"
    )
    return (
        f"{row.tier.name} does not fit in the memory of {machine}: {row.label}{numbers}. "
        f"You may go on ({why}), pick a tier that fits, plan for other hardware, or use "
        "files you already have."
    )


def cluster_summary(
    name: str, choice: LaunchChoice, rows: list[ClusterTierRow], best: ClusterTierRow | None
) -> str:
    """The tiers step's headline for a cluster: engine, SparkInfer's one tier, the pick."""
    title = rows[0].assessment.title if rows else choice.engine
    text = f"Judged for cluster {name} with {title}."
    if choice.engine == "sparkinfer":
        text += (
            f" {SPARKINFER_ONLY} tier (the pruned 9-shard set); run any other tier with "
            "llama.cpp RPC (choose it on the previous step) or on one machine."
        )
    if best is not None:
        text += f" Preselected: {best.tier.name} by {best.tier.publisher}, {best.label}."
    else:
        text += " Nothing can start on this cluster yet: each tier's verdict says why."
    if rows and not rows[0].assessment.probed:
        text += " Probe the cluster on the previous step for its memory plan."
    return text
