"""`ServeConfig`: the settings of `draftwheel serve` (configs/serve.yaml; a test keeps the two equal).

Values are checked in `__post_init__`, each error naming its field. Not here: loading the YAML and the
flag precedence (`draftwheel.serving.server.cli`), using the settings (`draftwheel.serving.server.app`).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftwheel.registry_names import CHAMPION_URI
from draftwheel.serving.engine.precision import check_device_name, check_dtype_name
from draftwheel.serving.engine.records import MODES
from draftwheel.serving.server.spec_metrics import LEVELS

MiB = 1024 * 1024
SCHEDULERS = ("serial", "batched")


@dataclass
class ServeConfig:
    """`draftwheel serve` settings (configs/serve.yaml); CLI flags override them."""

    host: str = "127.0.0.1"
    port: int = 8000
    target: str | None = None
    """Target model dir, hub id or models:/ URI; None = the target the draft's registry version (else the
    champion) was trained for, as its tags record it; with no champion, the reference target in
    $DRAFTWHEEL_HOME/models (draftwheel.serving.loading.resolve_target)."""
    draft: str | None = CHAMPION_URI
    """Draft model (dir, hub id, models:/NAME@ALIAS: reloaded when the alias moves); None = no draft."""
    medusa: str | None = None
    """Medusa heads dir (used when no draft is given)."""
    served_model_name: str | None = None
    """The `model` name clients send; None = the target's name."""
    api_key: str | None = None
    """Bearer key required on /v1/* (None = open; also read from $DRAFTWHEEL_API_KEY by the CLI).
    An empty or blank key is refused: it is how an unset shell variable arrives."""
    log_dir: str | None = None
    """Acceptance log dir, created if missing; the server refuses to start when it cannot write there.
    None = $DRAFTWHEEL_HOME/logs."""
    log_max_bytes: int = 64 * MiB
    log_flush_every: int = 32
    log_compress: bool = False
    k: int = 4
    min_path_prob: float = 0.25
    """eagle3 drafts: stop a chain once the draft's own probability of it falls below this (0 = always k
    tokens). Lossless either way; on the reference target k=4 with 0.25 gave 1.49x plain vs 1.42x for a
    fixed k=3."""
    index_branch: bool = False
    """Mode hybrid, greedy: a step that drafts with the eagle3 draft also verifies the suffix index's
    proposal, as a second branch of one token tree, so whichever is right is accepted."""
    runner_up: bool = True
    """eagle3 drafts, greedy: a drafting step also verifies the draft's second choice for the chain's first
    token beside the chain (a one-token branch), where its calibrated odds pay for the verify row."""
    adaptive_k: bool = False
    default_max_tokens: int = 256
    """max_tokens when the request gives none (clamped to the context left after the prompt)."""
    default_temperature: float = 1.0
    """temperature when the request gives none (OpenAI's default is 1)."""
    max_body_bytes: int = MiB
    """Largest request body accepted (413 above it, before parsing)."""
    max_prompt_chars: int = 100_000
    """Most prompt characters per request (all prompts, or all message texts; 413 above it, before
    tokenising). 100k characters tokenise in ~0.3 s on one core and are well over any served context."""
    drain_timeout_s: float = 30.0
    """On SIGINT/SIGTERM, how long in-flight requests may run before they are cut (and counted in the log)."""
    reload_poll_s: float = 30.0
    device: str = "auto"
    """Where the models run: auto (a CUDA GPU when present, else the CPU), cpu, cuda or cuda:N
    (draftwheel.serving.engine.precision.resolve_device)."""
    dtype: str = "auto"
    """Serving precision: auto (bfloat16 on CPUs with AMX-BF16, where a k+1-token verify costs about one
    decoding step, or AVX-512 BF16; else float32), float32 or bfloat16 (draftwheel.serving.engine.precision). Drafts follow the target."""
    mode: str | None = None
    """Mode of requests that name none (a request may send `mode` in its body): draft, medusa,
    autoregressive, suffix or hybrid; None = the router's pick when `router` is on, else the engine's
    default (hybrid with a draft and the suffix tier, draft without the tier, else medusa, else
    autoregressive). suffix and hybrid need `suffix_tier`."""
    suffix_tier: bool = True
    """Keep a suffix index of this target's earlier requests (built from the newest acceptance logs at
    start-up, updated as requests finish), so modes suffix and hybrid draft from it (hybrid takes either
    draft kind), and serve requests that name no mode in mode hybrid. On by default: hybrid was as fast
    as the draft alone or faster in the suffix benchmark's last runs and ~1.6x faster on the demo's code
    prompts (docs/serving.md). The monitor and mining judge
    only the draft's own steps of a hybrid request (draftwheel.serving.engine.records.draft_steps)."""
    suffix_max_requests: int = 50_000
    """Suffix index bound: most requests kept (oldest evicted first)."""
    suffix_max_tokens: int = 4_000_000
    """Suffix index bound: most tokens kept (prompt + output; oldest evicted first)."""
    suffix_startup_max_bytes: int = 256 * MiB
    """At start-up, read only the newest log files up to this many bytes on disk (at least the newest one)."""
    router: bool = False
    """Let the LinUCB router (draftwheel.serving.engine.routing) pick mode and k per request when neither the request nor
    `mode` names one; its state is kept in $DRAFTWHEEL_HOME/serving/router.json, fresh per champion.
    Off by default until it beats the fixed hybrid in benchmarks/bench_suffix.py."""
    per_request_spec_decode_metrics: str = "summary"
    """vLLM's setting of the same name: `summary` returns each request's speculative figures as
    `metrics.speculative_decoding` (the response body; when streaming, the final usage chunk, sent with
    `stream_options.include_usage`), `detailed` adds the per-step lists, `none` leaves responses as OpenAI
    sends them (draftwheel.serving.server.spec_metrics). On by default: the figures come from the record
    the request writes anyway."""
    state_save_s: float = 60.0
    """How often the suffix index stats and the router state are written under $DRAFTWHEEL_HOME/serving
    (and once at shutdown)."""
    scheduler: str = "batched"
    """How requests share the target: `batched`, continuous batching (draftwheel.serving.engine.batching):
    every running request advances in one target forward per step, joining and leaving at any step, under
    the four limits below (a request alone is decoded bitwise as one at a time); `serial`, one at a time
    in arrival order, every request bitwise as alone."""
    max_batch: int = 16
    """batched: requests decoding at once."""
    max_batch_tokens: int = 512
    """batched: tokens per forward; longer prompts are read in chunks beside the decoding requests."""
    kv_blocks: int = 1024
    """batched: the KV pool, in blocks of kv_block_size positions, allocated at start-up; a request holds
    blocks for its prompt + max_tokens while it runs (the reference target in bfloat16: 23 KiB a position,
    1024 x 16 positions = 368 MiB)."""
    kv_block_size: int = 16
    max_waiting: int = 256
    """batched: requests queued for a free row or KV blocks; more get a 503 (retry later), none is dropped."""
    prefix_caching: bool = False
    """batched: a prompt starting with full KV blocks another prompt computed (a system prompt, a chat
    template, a few-shot preamble) shares those blocks instead of computing them again; unused ones stay
    cached until the pool needs them (LRU). Off by default: a shared prefix's keys come from another
    request's forward, so greedy output is no longer bitwise one-at-a-time decoding's (float rounding)."""
    spec_explore: float = 0.1
    """batched: per batch size, the governor keeps the regime that emits most tokens per second: the rows
    speculating as they choose or plain steps (with spec_index_regime, also the suffix index alone;
    draftwheel.serving.engine.adaptive.SpecGovernor); it tries another on this share of its spans while
    the best's rate is not told apart from the others'..."""
    spec_explore_clear: float = 0.02
    """...and on this share once it is (2 standard errors apart): each span tried costs what the loser
    loses, and a change in traffic is still noticed. Equal to spec_explore: one share throughout."""
    spec_index_regime: bool = False
    """batched: the governor also weighs a third regime, the suffix index alone with the draft model capped.
    On templated traffic the draft cannot draft, served 4 at a time, it emitted 3.39 tokens a step
    against 2.38; on mixed traffic at 16 rows it cost 5-10 % (docs/results.md, "Serving under load")."""

    def engine_settings(self) -> dict[str, object]:
        """The engine's decoding settings (draftwheel.serving.engine.engine.Engine's keyword arguments)."""
        return {"min_path_prob": self.min_path_prob, "index_branch": self.index_branch,
                "runner_up": self.runner_up}

    def batch_config(self):
        """The batch engine's sizes (draftwheel.serving.engine.batching.BatchConfig)."""
        from draftwheel.serving.engine.batching import BatchConfig

        return BatchConfig(max_batch=self.max_batch, max_batch_tokens=self.max_batch_tokens,
                           kv_blocks=self.kv_blocks, kv_block_size=self.kv_block_size, max_waiting=self.max_waiting,
                           prefix_caching=self.prefix_caching, spec_explore=self.spec_explore,
                           spec_explore_clear=self.spec_explore_clear, spec_index_regime=self.spec_index_regime)

    def __post_init__(self) -> None:
        checks = {"port": 0 <= self.port <= 65535, "log_max_bytes": self.log_max_bytes > 0,
                  "log_flush_every": self.log_flush_every > 0, "k": 1 <= self.k <= 32,
                  "min_path_prob": 0.0 <= self.min_path_prob < 1.0,
                  "default_max_tokens": self.default_max_tokens >= 1,
                  "default_temperature": self.default_temperature >= 0, "reload_poll_s": self.reload_poll_s > 0,
                  "max_body_bytes": self.max_body_bytes > 0, "max_prompt_chars": self.max_prompt_chars > 0,
                  "drain_timeout_s": self.drain_timeout_s >= 0, "suffix_max_requests": self.suffix_max_requests >= 1,
                  "suffix_max_tokens": self.suffix_max_tokens >= 1,
                  "suffix_startup_max_bytes": self.suffix_startup_max_bytes >= 0, "state_save_s": self.state_save_s > 0,
                  "max_batch": self.max_batch >= 1,
                  "max_batch_tokens": self.max_batch_tokens >= 1, "kv_blocks": self.kv_blocks >= 1,
                  "kv_block_size": self.kv_block_size >= 1, "max_waiting": self.max_waiting >= 1,
                  "spec_explore": 0.0 <= self.spec_explore <= 1.0,
                  "spec_explore_clear": 0.0 <= self.spec_explore_clear <= self.spec_explore}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler: {self.scheduler!r} not one of {', '.join(SCHEDULERS)}")
        check_dtype_name(self.dtype)
        check_device_name(self.device)
        if self.per_request_spec_decode_metrics not in LEVELS:
            raise ValueError(f"per_request_spec_decode_metrics: {self.per_request_spec_decode_metrics!r} not one of "
                             f"{', '.join(LEVELS)}")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} not one of {', '.join(MODES)} (or null)")
        if self.mode in ("suffix", "hybrid") and not self.suffix_tier:
            raise ValueError(f"mode: {self.mode!r} needs suffix_tier: true")
        if self.api_key is not None and (not self.api_key.strip() or self.api_key != self.api_key.strip()):
            raise ValueError(f"api_key: {self.api_key!r} is empty or has surrounding blanks (use null for no key; "
                             "an unset shell variable passed as --api-key \"$KEY\" arrives as an empty string)")
