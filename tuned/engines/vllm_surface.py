"""Every vLLM internal tuned relies on, in one place (data only: no vLLM import).

tuned subclasses vLLM's scheduler and replaces its waiting queue, so it depends on
names vLLM does not promise to keep from one release to the next. This list names
each of them: the modules and classes tuned imports, the methods it overrides or
calls with the parameters it expects, the attributes it reads or writes, the config
fields it reads, the command-line flags it passes and the strings it looks for.
:mod:`tuned.engines.vllm_surface_check` reads a vLLM wheel's or an installed vLLM's
source (with ``ast``, without importing it) and reports each entry as present,
changed or missing (``tools/vllm_surface.py``); ``docs/vllm-surface/`` keeps the
report of each release tuned supports. A new use of a vLLM internal in tuned adds
an entry here, and the reports are regenerated (docs/compatibility.md says how).

An entry is ``Internal(kind, name, expect, use)``. ``name`` is ``module:Qual.name``
(``module`` alone for a module or a package of modules; ``*:Class`` finds a class by
its name wherever it is defined). ``kind`` says what tuned needs it to be:

``module``
    a module or package that exists.
``class``
    a class defined in (or imported into) the module; ``expect``: base classes it
    must still have, comma-separated.
``name``
    a module-level name (defined, assigned or imported there).
``method``
    a plain method of the class or of a vLLM base class; ``expect``: its
    parameters, names only (``=`` marks a default; annotations are not compared).
``property``
    a ``property`` (or ``cached_property``) of the class or a vLLM base.
``attribute``
    an instance attribute: ``self.X = ...`` in ``__init__`` of the class or a vLLM
    base (or in a method ``__init__`` calls on ``self``).
``field``
    a class-level name: a dataclass, pydantic or msgspec field, or an enum member.
``constructor``
    tuned builds the class with these keyword arguments (``expect``, space
    separated): each must be a field, and no field without a default may be missing.
``abstract``
    the abstract methods of the class (``expect``, space separated) are exactly
    these: tuned implements each one, and a new one would go unguarded.
``calls``
    the methods vLLM's own code (the module) calls on an object tuned replaces;
    ``name`` is ``module:receiver|receiver``; exactly ``expect``.
``flag``
    a command-line flag (``expect``) tuned passes: a field of the named argument
    class (``*:EngineArgs``, ``*:FrontendArgs``) or of one of its bases.
``literal``
    a string (``expect``) that appears in the module or package's source: a
    metric name or an HTTP route tuned reads.
``routes``
    the POST routes vLLM's API server declares in the package (``.post("/x")``,
    ``.api_route("/x")``) are all among ``expect``: each is sorted into
    :data:`QUEUED_ROUTES` or :data:`UNQUEUED_ROUTES`.
``unclaimed``
    names tuned's subclass adds (``expect``, space separated): vLLM's class must
    define none of them, or tuned would overwrite vLLM's own.
"""

from __future__ import annotations

from typing import NamedTuple


class Internal(NamedTuple):
    kind: str
    name: str
    expect: str = ""
    use: str = ""


KINDS = ("module", "class", "name", "method", "property", "attribute", "field",
         "constructor", "abstract", "calls", "flag", "literal", "routes", "unclaimed")

#: vLLM's POST routes whose request queues in the engine -- generation in each API
#: flavour, then pooling -- over every supported release: tuned's gateway answers
#: them 429 while the queue refuses (:data:`tuned.engines.gateway.PATHS`). A route
#: a release does not have is never asked for there.
QUEUED_ROUTES = frozenset((
    "/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch",
    "/v1/responses", "/v1/messages", "/cohere/v2/chat", "/inference/v1/generate",
    "/invocations", "/generative_scoring", "/v1/systemone", "/v1/decisions",
    "/v1/audio/transcriptions", "/v1/audio/translations",
    "/v1/embeddings", "/v2/embed", "/pooling", "/classify",
    "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
))
#: vLLM's POST routes that make no engine request (the gateway lets them through):
#: render, tokenize and token counting, LoRA and admin routes.
UNQUEUED_ROUTES = frozenset((
    "/tokenize", "/detokenize", "/v1/messages/count_tokens", "/v1/completions/render",
    "/v1/chat/completions/render", "/v1/messages/render", "/v1/responses/render",
    "/cohere/v2/chat/render", "/v1/completions/derender", "/v1/chat/completions/derender",
    "/v1/responses/{response_id}/cancel", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/ping", "/abort_requests", "/pause", "/resume", "/sleep",
    "/wake_up", "/release_kv_cache_memory", "/reset_prefix_cache", "/reset_mm_cache",
    "/reset_encoder_cache", "/start_profile", "/stop_profile", "/collective_rpc",
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/fault_tolerance/apply",
    "/init_weight_transfer_engine", "/start_weight_update", "/finish_weight_update",
    "/start_draft_weight_update", "/update_weights", "/update_weight_version",
    "/shutdown_weight_transfer_engine", "/weight_checker",
))
#: the routes above that a later supported release added: (major, minor) of the first
ROUTES_SINCE = {"/v1/decisions": (0, 33)}

_S = "vllm.v1.core.sched.scheduler:Scheduler"
_A = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
_Q = "vllm.v1.core.sched.request_queue"
_R = "vllm.v1.request:Request"
_RS = "vllm.v1.request:RequestStatus"
_V = "tuned/engines/vllm.py"
_VQ = "tuned/engines/vllm_queue.py"
_CORE = "tuned/core/queue.py"

#: What tuned's own scheduler subclass (``_TunedMixin`` in :mod:`tuned.engines.vllm`)
#: adds to vLLM's scheduler: methods and ``self.X`` attributes. Kept equal to the
#: mixin's source by tests/engines/test_vllm_surface.py.
TUNED_SCHEDULER_NAMES = (
    "_apply_queue_policy", "_block_pool", "_clock", "_emit_refused", "_first_token_s",
    "_hint_warning", "_kv_usable_blocks", "_kv_used_blocks", "_last_update_t",
    "_pending_queue", "_queue_installed", "_refused_out", "_sched_times", "_step_guard",
    "_tuned_apply", "_tuned_errors", "_tuned_guard", "_tuned_record", "_tuned_recover",
    "_tuned_setup", "_wall_offset_s", "_write_knobs", "active_requests", "answer_refusals",
    "applied", "ceiling", "controller", "counts", "dp_rank", "endpoint", "finished",
    "kv_bytes_per_token", "kv_capacity_tokens", "kv_usage_now", "last_step_done_s",
    "max_num_batched_tokens", "metrics", "oldest_wait_s", "prefilling", "present_prompts",
    "queue_policy", "queue_snapshot", "set_queue_policy", "steps", "steps_json", "tuned",
)

INTERNALS: tuple[Internal, ...] = (
    # --- the version check
    Internal("name", "vllm:__version__", use=f"{_V}: the start-up version check"),
    # --- the scheduler classes tuned subclasses
    Internal("class", _S, use=f"{_V}: TunedSyncScheduler's base"),
    Internal("class", _A, "Scheduler", use=f"{_V}: TunedAsyncScheduler's base (GPU default)"),
    Internal("method", f"{_S}.__init__",
             "self, vllm_config, kv_cache_config, structured_output_manager, block_size, "
             "hash_block_size=, mm_registry=, include_finished_set=, log_stats=",
             use=f"{_V}: TunedScheduler.__new__ reads vllm_config (keyword or first "
                 "argument); the subclasses pass the rest through"),
    Internal("method", f"{_S}.schedule", "self, throttle_prefills=",
             use=f"{_V}: overridden (apply the knobs, then vLLM schedules)"),
    Internal("method", f"{_S}.update_from_output",
             "self, scheduler_output, model_runner_output",
             use=f"{_V}: overridden (record a step sample; returns vLLM's "
                 "dict of EngineCoreOutputs by client index)"),
    Internal("method", f"{_S}._free_request", "self, request, delay_free_blocks=",
             use=f"{_V}: overridden (record the finished request)"),
    Internal("method", f"{_S}.shutdown", "self", use=f"{_V}: overridden (stop the controller)"),
    Internal("method", f"{_S}.get_request_counts", "self",
             use=f"{_V}: (running, waiting) for the controller"),
    Internal("method", f"{_S}.finish_requests", "self, request_ids, finished_status",
             use=f"{_V}: answer_refusals ends refused requests as aborted"),
    Internal("method", f"{_A}.schedule", "self, throttle_prefills=",
             use=f"{_V}: overridden on the async base"),
    Internal("method", f"{_A}.update_from_output",
             "self, scheduler_output, model_runner_output",
             use=f"{_V}: overridden on the async base"),
    Internal("method", f"{_A}._free_request", "self, request, delay_free_blocks=",
             use=f"{_V}: overridden on the async base"),
    Internal("method", f"{_A}.shutdown", "self", use=f"{_V}: overridden on the async base"),
    # --- the scheduler's attributes tuned reads and writes
    Internal("attribute", f"{_S}.max_num_active_reqs",
             use=f"{_V}: written each step (the live batch-size cap, the admission gate)"),
    Internal("attribute", f"{_S}.max_num_scheduled_tokens",
             use=f"{_V}: written each step (the live token budget)"),
    Internal("attribute", f"{_S}.max_num_running_reqs",
             use=f"{_V}: read once (the ceiling: the model runner's slots)"),
    Internal("attribute", f"{_S}.waiting",
             use=f"{_VQ}: replaced by tuned's PolicyQueue; {_V} reads it"),
    Internal("attribute", f"{_S}.running", use=f"{_V}: read (running requests)"),
    Internal("attribute", f"{_S}.vllm_config", use=f"{_V}: tuned's config and engine settings"),
    Internal("attribute", f"{_S}.scheduler_config", use=f"{_V}: max_num_batched_tokens"),
    Internal("attribute", f"{_S}.parallel_config", use=f"{_V}: the data-parallel rank"),
    Internal("attribute", f"{_S}.kv_cache_config", use=f"{_V}: KV bytes per token"),
    Internal("attribute", f"{_S}.kv_cache_manager", use=f"{_V}: its block_pool"),
    Internal("attribute", f"{_S}.block_size", use=f"{_V}: KV tokens per block"),
    Internal("unclaimed", _S, " ".join(TUNED_SCHEDULER_NAMES),
             use=f"{_V}: names _TunedMixin adds to the scheduler"),
    Internal("unclaimed", _A, " ".join(TUNED_SCHEDULER_NAMES),
             use=f"{_V}: names _TunedMixin adds to the async scheduler"),
    Internal("attribute", "vllm.v1.core.kv_cache_manager:KVCacheManager.block_pool",
             use=f"{_V}: the KV block pool"),
    Internal("attribute", "vllm.v1.core.block_pool:BlockPool.num_gpu_blocks",
             use=f"{_V}, {_VQ}: KV capacity"),
    Internal("method", "vllm.v1.core.block_pool:BlockPool.get_num_free_blocks", "self",
             use=f"{_V}, {_VQ}: KV blocks in use, free KV tokens"),
    Internal("field", "vllm.v1.kv_cache_interface:KVCacheConfig.kv_cache_tensors",
             use=f"{_VQ}: KV bytes per token"),
    Internal("field", "vllm.v1.kv_cache_interface:KVCacheTensor.size",
             use=f"{_VQ}: KV bytes per token"),
    Internal("field", "vllm.v1.kv_cache_interface:KVCacheTensor.host_resident",
             use=f"{_VQ}: host-resident tensors left out (read with a default)"),
    # --- config fields read
    Internal("field", "vllm.config:VllmConfig.scheduler_config", use=f"{_V}, {_VQ}"),
    Internal("field", "vllm.config:VllmConfig.model_config", use=f"{_V}: engine settings"),
    Internal("field", "vllm.config:VllmConfig.cache_config", use=f"{_V}: engine settings"),
    Internal("field", "vllm.config:VllmConfig.parallel_config", use=f"{_V}"),
    Internal("field", "vllm.config:VllmConfig.additional_config",
             use="tuned/config/handoff.py engine_setup: tuned's config hand-off"),
    Internal("field", "vllm.config:SchedulerConfig.max_num_seqs", use=f"{_V}: engine settings"),
    Internal("field", "vllm.config:SchedulerConfig.max_num_batched_tokens",
             use=f"{_V}: the token budget's bound"),
    Internal("field", "vllm.config:SchedulerConfig.async_scheduling",
             use=f"{_V}: TunedScheduler picks its base"),
    Internal("field", "vllm.config:SchedulerConfig.policy",
             use=f"{_VQ}: priority scheduling"),
    Internal("field", "vllm.config:ModelConfig.max_model_len", use=f"{_V}: engine settings"),
    Internal("field", "vllm.config:ModelConfig.model", use=f"{_V}: engine settings"),
    Internal("field", "vllm.config:CacheConfig.num_gpu_blocks_override",
             use=f"{_V}: engine settings"),
    Internal("field", "vllm.config:ParallelConfig.data_parallel_index",
             use=f"{_V}: dp_rank (the real rank of an independent dense rank)"),
    Internal("field", "vllm.config:ParallelConfig.data_parallel_rank",
             use=f"{_V}: dp_rank's fallback"),
    # --- the waiting queue tuned replaces
    Internal("class", f"{_Q}:RequestQueue", use=f"{_VQ}: PolicyQueue's base"),
    Internal("abstract", f"{_Q}:RequestQueue",
             "__bool__ __iter__ __len__ add_request peek_request pop_request "
             "prepend_request prepend_requests remove_request remove_requests",
             use=f"{_VQ}: PolicyQueue guards each of them"),
    Internal("method", f"{_Q}:RequestQueue.add_request", "self, request", use=f"{_VQ}"),
    Internal("method", f"{_Q}:RequestQueue.pop_request", "self", use=f"{_VQ}"),
    Internal("method", f"{_Q}:RequestQueue.peek_request", "self", use=f"{_VQ}"),
    Internal("method", f"{_Q}:RequestQueue.prepend_request", "self, request", use=f"{_VQ}"),
    Internal("method", f"{_Q}:RequestQueue.prepend_requests", "self, requests", use=f"{_VQ}"),
    Internal("method", f"{_Q}:RequestQueue.remove_request", "self, request", use=f"{_VQ}"),
    Internal("method", f"{_Q}:RequestQueue.remove_requests", "self, requests", use=f"{_VQ}"),
    Internal("calls", "vllm.v1.core.sched:self.waiting|request_queue|from_queue",
             "add_request peek_request pop_request prepend_request prepend_requests "
             "remove_requests",
             use=f"{_VQ}: what vLLM's schedulers call on the waiting queue"),
    Internal("class", f"{_Q}:FCFSRequestQueue", use=f"{_VQ}: the fallback queue"),
    Internal("class", f"{_Q}:PriorityRequestQueue",
             use=f"{_VQ}: the fallback queue under priority scheduling"),
    Internal("method", f"{_Q}:PriorityRequestQueue.__init__", "self",
             use=f"{_VQ}: built without arguments"),
    # --- requests
    Internal("class", _R, use=f"{_VQ}: typing; {_V}, {_CORE}: read"),
    Internal("attribute", f"{_R}.request_id", use=f"{_V}, {_VQ}, {_CORE}"),
    Internal("attribute", f"{_R}.num_prompt_tokens", use=f"{_V}, {_CORE}"),
    Internal("attribute", f"{_R}.max_tokens", use=f"{_V}, {_CORE}"),
    Internal("property", f"{_R}.num_output_tokens", use=f"{_V}, {_CORE}"),
    Internal("attribute", f"{_R}.num_computed_tokens", use=f"{_V}: prefilling, resident KV"),
    Internal("attribute", f"{_R}.arrival_time", use=f"{_V}, {_VQ}, {_CORE} (wall clock)"),
    Internal("attribute", f"{_R}.priority", use=f"{_CORE}: priority scheduling"),
    Internal("attribute", f"{_R}.status", use=f"{_VQ}: preempted, finished statuses"),
    Internal("attribute", f"{_R}.sampling_params", use=f"{_VQ}: the request's hints"),
    Internal("attribute", f"{_R}.num_preemptions", use=f"{_V}: finished-request record"),
    Internal("attribute", f"{_R}.client_index", use=f"{_V}: refused requests' outputs"),
    Internal("attribute", f"{_R}.trace_headers", use=f"{_V}: refused requests' outputs"),
    Internal("method", f"{_R}.get_finished_reason", "self",
             use=f"{_V}: refused requests' outputs"),
    Internal("method", f"{_R}.take_events", "self", use=f"{_V}: refused requests' outputs"),
    Internal("field", "vllm.sampling_params:SamplingParams.extra_args",
             use=f"{_VQ}: the request's hints (vllm_xargs)"),
    Internal("class", _RS, use=f"{_V}, {_VQ}"),
    Internal("field", f"{_RS}.PREEMPTED", use=f"{_VQ}: preempted requests go first"),
    Internal("field", f"{_RS}.FINISHED_ABORTED", use=f"{_V}: refused requests"),
    Internal("field", f"{_RS}.FINISHED_STOPPED", use=f"{_VQ}: learn output lengths"),
    Internal("field", f"{_RS}.FINISHED_LENGTH_CAPPED", use=f"{_VQ}: learn output lengths"),
    Internal("field", f"{_RS}.FINISHED_REPETITION", use=f"{_VQ}: learn output lengths"),
    # --- a step's input and output
    Internal("field", "vllm.v1.core.sched.output:SchedulerOutput.num_scheduled_tokens",
             use=f"{_V}: step sample"),
    Internal("field", "vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens",
             use=f"{_V}: step sample"),
    Internal("field", "vllm.v1.core.sched.output:SchedulerOutput.scheduled_spec_decode_tokens",
             use=f"{_V}: step sample (speculative decoding)"),
    Internal("field", "vllm.v1.core.sched.output:SchedulerOutput.preempted_req_ids",
             use=f"{_V}: step sample"),
    Internal("field", "vllm.v1.outputs:ModelRunnerOutput.sampled_token_ids",
             use=f"{_V}: step sample (generated tokens)"),
    Internal("class", "vllm.v1.engine:EngineCoreOutput", use=f"{_V}: refused requests' outputs"),
    Internal("constructor", "vllm.v1.engine:EngineCoreOutput",
             "request_id new_token_ids finish_reason events trace_headers",
             use=f"{_V}: one final output per refused request"),
    Internal("class", "vllm.v1.engine:EngineCoreOutputs", use=f"{_V}: refused requests' outputs"),
    Internal("constructor", "vllm.v1.engine:EngineCoreOutputs", "",
             use=f"{_V}: built empty for a client with no other output this step"),
    Internal("field", "vllm.v1.engine:EngineCoreOutputs.outputs", use=f"{_V}: appended to"),
    # --- the general plugin (refuses a config that contradicts vLLM's arguments)
    Internal("literal", "vllm.plugins", "vllm.general_plugins",
             use="pyproject.toml: the entry-point group tuned's plugin is registered in"),
    Internal("method", "vllm.engine.arg_utils:EngineArgs.create_engine_config",
             "self, usage_context=, headless=",
             use="tuned/engines/vllm_plugin.py: wrapped (reads usage_context)"),
    Internal("field", "vllm.config:SchedulerConfig.scheduler_cls",
             use="tuned/engines/vllm_plugin.py: acts only where it names tuned's scheduler"),
    Internal("field", "vllm.usage.usage_lib:UsageContext.OPENAI_API_SERVER",
             use="tuned/engines/vllm_plugin.py: the API server exits without a traceback"),
    # --- the server tuned starts and reads
    Internal("module", "vllm.entrypoints.openai.api_server",
             use="tuned/launch/launcher.py: python -m vllm.entrypoints.openai.api_server"),
    Internal("flag", "*:EngineArgs", "--model", use="tuned/launch/launcher.py"),
    Internal("flag", "*:EngineArgs", "--max-num-seqs", use="tuned/launch/launcher.py"),
    Internal("flag", "*:EngineArgs", "--max-num-batched-tokens", use="tuned/launch/launcher.py"),
    Internal("flag", "*:EngineArgs", "--max-model-len", use="tuned/launch/launcher.py"),
    Internal("flag", "*:EngineArgs", "--num-gpu-blocks-override", use="tuned/launch/launcher.py"),
    Internal("flag", "*:EngineArgs", "--scheduler-cls", use="tuned/launch/launcher.py: tuned's scheduler"),
    Internal("flag", "*:EngineArgs", "--additional-config",
             use="tuned/launch/launcher.py: tuned's config hand-off"),
    Internal("flag", "*:EngineArgs", "--dtype", use="tuned/base/hostinfo.py: the demo model's dtype"),
    Internal("flag", "*:EngineArgs", "--data-parallel-size",
             use="tuned/launch/serve.py: one endpoint per rank"),
    Internal("flag", "*:FrontendArgs", "--host", use="tuned/launch/launcher.py"),
    Internal("flag", "*:FrontendArgs", "--port", use="tuned/launch/launcher.py"),
    Internal("flag", "*:FrontendArgs", "--middleware",
             use="tuned/launch/launcher.py: tuned's 429 gateway (tuned/engines/gateway.py)"),
    Internal("routes", "vllm.entrypoints", " ".join(sorted(QUEUED_ROUTES | UNQUEUED_ROUTES)),
             use="tuned/engines/gateway.py: PATHS (QUEUED_ROUTES) refused while the queue "
                 "refuses, UNQUEUED_ROUTES let through"),
    Internal("literal", "vllm.entrypoints", "/health", use="tuned/launch/launcher.py, tuned/launch/serve.py"),
    Internal("literal", "vllm.entrypoints", "/v1/models", use="tuned/launch/launcher.py"),
    Internal("literal", "vllm.entrypoints", "/version", use="tuned/launch/launcher.py server_info"),
    Internal("literal", "vllm.v1.metrics", "vllm:inter_token_latency_seconds",
             use="tuned/bench/live.py: the engine's inter-token latency"),
)
