"""The application layer: the one place the shells call.

The CLI (:mod:`k3desk.cli`) and the desktop app (:mod:`k3desk.ui`) are adapters: they
turn input into a request, call a use-case here, and render its result as text,
JSON or widgets.  No figure a person sees is computed in a shell.

=====================================  ==========================================
use-case                               module
=====================================  ==========================================
the composition root (``Services``)    :mod:`k3desk.core.app.services`
which machine is judged                :mod:`k3desk.core.app.subject`
judge the tiers for hardware H         :mod:`k3desk.core.app.tiers`
judge the tiers for a cluster          :mod:`k3desk.core.app.cluster_tiers`
plan a shard set for hardware H        :mod:`k3desk.core.app.shardplan`
plan a set on the Hub before download  :mod:`k3desk.core.app.remote_plan`
what the Hub has, judged               :mod:`k3desk.core.app.search`
find the model in a folder             :mod:`k3desk.core.app.models`
my models: add, list, judge, remove    :mod:`k3desk.core.app.library`
prepare a local launch                 :mod:`k3desk.core.app.launch`
the engines found, the one chosen      :mod:`k3desk.core.app.engine_choice`
what a kept engine was launched with   :mod:`k3desk.core.app.kept_launch`
the question before switching models   :mod:`k3desk.core.app.model_switch`
run and record a chat turn             :mod:`k3desk.core.app.chat_turn`
configure a SparkInfer launch          :mod:`k3desk.core.app.sparkinfer_launch`
engines: list, probe, choose, check    :mod:`k3desk.core.app.engines`
for images, build; the launch and the
tuning run the app's settings make
downloads from the Hub                 :mod:`k3desk.core.app.downloads`
clusters: nodes, probe, plan, serve    :mod:`k3desk.core.app.clusters`
remote endpoints: add, check, remove   :mod:`k3desk.core.app.endpoints`
a user action and what it changed      :mod:`k3desk.core.app.operations`
the app's named operations             :mod:`k3desk.core.app.actions`
a table row -> its cells               :mod:`k3desk.core.app.presenters`
=====================================  ==========================================

The value types the shells use as they are come from a short list of modules here too,
never from the core package that defines them:

=====================================  ==========================================
values                                 module
=====================================  ==========================================
errors, units, progress and cancel     :mod:`k3desk.core.app.values`
tokens, settings, the tier, printable
paths
chat client, dialects, history,        :mod:`k3desk.core.app.chat`
images
the machine, its disks, verdicts       :mod:`k3desk.core.app.hardware`
shard sets and their inspection        :mod:`k3desk.core.app.shards`
=====================================  ==========================================

Each names what it offers in ``__all__``.  An import-linter contract (pyproject.toml)
forbids ``k3desk.ui`` and ``k3desk.cli`` every other module of the core, with no
exemption: a shell that needs something new from the core gets it added here.

Modules are imported one by one (``from k3desk.core.app.tiers import judge_tiers``),
so a shell pays only for what it uses.
"""
