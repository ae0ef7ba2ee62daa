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
find the model in a folder             :mod:`k3desk.core.app.models`
my models: add, list, judge, remove    :mod:`k3desk.core.app.library`
prepare a local launch                 :mod:`k3desk.core.app.launch`
the engines found, the one chosen      :mod:`k3desk.core.app.engine_choice`
what a kept engine was launched with   :mod:`k3desk.core.app.kept_launch`
the question before switching models   :mod:`k3desk.core.app.model_switch`
run and record a chat turn             :mod:`k3desk.core.app.chat_turn`
configure a SparkInfer launch          :mod:`k3desk.core.app.sparkinfer_launch`
=====================================  ==========================================

Modules are imported one by one (``from k3desk.core.app.tiers import judge_tiers``),
so a shell pays only for what it uses.
"""
