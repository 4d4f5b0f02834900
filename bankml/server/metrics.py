"""llama-server's /metrics (`--metrics`): its server_metrics counted from each generation, written
in the Prometheus text format by prometheus_client under llama-server's names.

    m = Metrics(n_batch=2048)
    m.record(result)                       # after each generation (engine.Result)
    m.step(n_slots)                        # a decode step the slots shared (server/steps.py)
    body = m.exposition(busy=1, queued=0)  # GET /metrics; the rate gauges restart at each scrape

Counters since the start (tools/server/server-common.h server_metrics): prompt tokens computed
and taken from the cache, the seconds they took, generated tokens and their seconds, llama_decode
calls (a prompt's share of n_batch tokens each, then one per generated token but the last, whose
logits nobody reads) and the longest sequence a decode saw. Gauges: the prompt and generation
rates since the last scrape (decode steps over their time: a generation's first token comes with
its prompt), requests being processed and waiting, busy slots per decode (the slots a decode
step took, averaged over every llama_decode; a prompt's decode takes its one slot).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4"
PREFIX = "llamacpp:"


@dataclass
class _Bucket:
    """server_metrics::bucket: tokens, decode steps and seconds."""
    count: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, n: int, steps: int, seconds: float) -> None:
        self.count += n
        self.steps += steps
        self.seconds += seconds

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


class Metrics:
    def __init__(self, n_batch: int = 2048):
        self.n_batch = n_batch                  # llama-server's -b: prompt tokens a llama_decode takes
        self.started = time.time()
        self._lock = threading.Lock()
        self.prompt, self.predict = _Bucket(), _Bucket()
        self.prompt_window, self.predict_window = _Bucket(), _Bucket()
        self.n_prompt_cached = self.n_tokens_max = self.n_decode = self.n_busy_slots = 0
        self.registry = CollectorRegistry(auto_describe=False)     # this server's own, no global state
        self._scrape: tuple[int, int] = (0, 0)
        self.registry.register(self)

    def record(self, r, shared_steps: bool = False) -> None:
        """One finished generation (engine.Result), as llama-server counts it; with shared_steps its
        tokens' decodes were the slots' shared steps, which step() counts."""
        n_gen = len(r.tokens)
        decodes = -(-r.n_processed // self.n_batch) + (0 if shared_steps else max(n_gen - 1, 0))
        with self._lock:
            for b in (self.prompt, self.prompt_window):
                b.add(r.n_processed, r.n_processed, r.t_prompt_ms / 1e3)
            for b in (self.predict, self.predict_window):
                b.add(n_gen, max(n_gen - 1, 0), r.t_gen_ms / 1e3)
            self.n_prompt_cached += r.n_cached
            self.n_decode += decodes
            self.n_busy_slots += decodes
            self.n_tokens_max = max(self.n_tokens_max, r.n_prompt + max(n_gen - 1, 0))

    def step(self, n_slots: int) -> None:
        """One decode step that took n_slots slots' tokens (one llama_decode)."""
        with self._lock:
            self.n_decode += 1
            self.n_busy_slots += n_slots

    def collect(self):
        """prometheus_client's collector interface: llama-server's counters, then its gauges."""
        busy, queued = self._scrape
        counters = (("prompt_tokens", "Number of prompt tokens processed, excluding cached tokens", self.prompt.count),
                    ("prompt_tokens_cached", "Number of prompt tokens reused from the cache", self.n_prompt_cached),
                    ("prompt_seconds", "Total time spent processing prompts", self.prompt.seconds),
                    ("tokens_predicted", "Number of generation tokens processed", self.predict.count),
                    ("tokens_predicted_seconds", "Total time spent generating tokens", self.predict.seconds),
                    ("n_decode", "Total number of llama_decode() calls, excluding speculative decoding and "
                                 "multimodal decoding", self.n_decode),
                    # bankml decodes no draft tokens: llama-server's speculative counters stay 0
                    ("spec_decode_num_draft_tokens", "Speculative: Total draft tokens generated", 0),
                    ("spec_decode_num_accepted_tokens", "Speculative: Total draft tokens accepted by the target model",
                     0),
                    ("spec_decode_num_drafts", "Speculative: Total speculative decoding verification steps", 0))
        for name, doc, value in counters:
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        gauges = (("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
                  ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", self.prompt_window.rate()),
                  ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
                   self.predict_window.rate()),
                  ("requests_processing", "Number of requests processing", busy),
                  ("requests_deferred", "Number of requests deferred", queued),
                  ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
                   self.n_busy_slots / self.n_decode if self.n_decode else 0))
        for name, doc, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)

    def exposition(self, busy: int, queued: int) -> bytes:
        """The text a scrape gets; the rate gauges' window starts again (as llama-server's buckets)."""
        with self._lock:
            self._scrape = (busy, queued)
            text = generate_latest(self.registry)
            self.prompt_window, self.predict_window = _Bucket(), _Bucket()
        return text
