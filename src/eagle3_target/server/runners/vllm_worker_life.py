"""Ties each vLLM worker's life to its parent's from the worker's first moments.

vLLM imports ``ExitWithParent`` in every worker process before it sets up the device or loads the model
(EngineArgs ``worker_extension_cls``, vllm_engine.WORKER_LIFE), so importing this module is what starts
the watch: nothing else may import it. vLLM's own
watch of its parent starts only once the worker is loaded, and then only closes its queues: a `serve` (or a
node) killed while the engine was starting used to leave its workers running.
"""

from ..lifeline import exit_with_parent


class ExitWithParent:
    """The worker extension vLLM mixes into its worker class: it adds no calls of its own."""


exit_with_parent()  # imported only in a vLLM worker (by vllm_engine.WORKER_LIFE), as it starts
