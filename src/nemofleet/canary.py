"""The canary gate's arithmetic (issue 38): vLLM's Prometheus text -> a window's figures -> a verdict.

Pure: standard library only, no pyinfra, no I/O. `nemofleet rollout --bake` (fleet/rollout.py)
feeds it the /metrics text of every instance of the canary batch and of the baseline every few
seconds; this module turns the samples into figures and says pass, breach or thin.

What is read, under the names real vLLM 0.27.1 and 0.32.0 export (the stand-in exports the same):
- `http_requests_total{handler,method,status}` from prometheus-fastapi-instrumentator, which vLLM
  mounts with status codes grouped (`2xx`, `4xx`, `5xx`): requests = every answer of an inference
  handler (a POST to `/v1/...` or `/invocations`: not the model list), errors = its `5xx` answers (a 4xx is the client's fault).
  A server without it falls back to `vllm:request_success_total` (requests, errors unknown: 0).
- `vllm:time_to_first_token_seconds` and `vllm:e2e_request_latency_seconds` histograms: their p95.
Counters are summed over every label set of one instance (engines, finish reasons); a counter that
goes down between two samples means the instance restarted: that sample counts from zero (as
Prometheus' increase() does). Histograms of different bucket bounds (two vLLM versions, or the
canary and the baseline) are merged on the union of their bounds, each interpolated linearly
inside its own buckets, as histogram_quantile() interpolates.

The rule (docs/fleet.md, "Canary gate"): judged only once both sides served `min_requests` in the
window; the canary breaks the SLO when
- its error rate exceeds the baseline's by more than `error_points` percentage points, the
  baseline counting for at most `error_points` itself (a baseline that is itself failing does not
  excuse a canary that fails as much: it is held to at most twice the points), or
- its p95 TTFT or p95 end-to-end latency is more than `latency_ratio` times the baseline's (and
  more than LATENCY_FLOOR seconds above it: bucket edges at a few milliseconds are no signal).
A breach is final as soon as it is seen; a pass only at the end of the bake.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .valuetypes import host_number, reads_host

INFERENCE = ("/v1/", "/invocations")
TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
HTTP = "http_requests_total"
SUCCESS = "vllm:request_success_total"
WANTED = (HTTP, SUCCESS, TTFT + "_bucket", E2E + "_bucket")
LATENCY_FLOOR = 0.025  # seconds: a p95 this close to the baseline's is within a bucket's noise
THIN_CHOICES = ("pass", "fail", "wait")

COUNT_MAX = 2**53  # a sample the gate reads is a count or a bucket bound: never more, never negative
# the longest sample line read: vLLM's are under 300 characters; a 20 KB line held a bake poll for 3 s
MAX_LINE = 4096
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# the sample under which parse() counts the lines of a metric the gate reads that it cannot read:
# the gate fails closed on them (verdict), it never judges without them
UNREADABLE = ("nemofleet:unreadable_lines", ())


# ---------------------------------------------------------------------------- parsing

@reads_host(lambda why, text: {})
def parse(text: str) -> dict[tuple, float]:
    """The samples the gate reads from one /metrics text: {(name, ((label, value), ...)): value}.
    Other metrics and comments are skipped; a line of a metric the gate reads that does not parse
    (a value that is no count: NaN, +Inf, 1e309, '٣'; a line longer than MAX_LINE) is counted under
    UNREADABLE (never an exception, never left out silently: the gate fails closed on it)."""
    out: dict[tuple, float] = {}
    for line in text.splitlines():
        if not line.startswith(WANTED):
            continue
        m = _LINE.match(line) if len(line) <= MAX_LINE else None  # _LABEL is quadratic in a line's length
        if m is None or (value := host_number(m.group(3), 0, COUNT_MAX, decimal=True)) is None:
            out[UNREADABLE] = out.get(UNREADABLE, 0) + 1
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = value
    return out


# ---------------------------------------------------------------------------- figures

@dataclass
class Figures:
    """One side's figures over a window: requests, 5xx errors, and the two latency histograms as
    {upper bound: cumulative count} (math.inf for +Inf)."""
    requests: float = 0.0
    errors: float = 0.0
    ttft: dict = field(default_factory=dict)
    e2e: dict = field(default_factory=dict)
    unreadable: int = 0  # sample lines the gate could not read (parse's UNREADABLE)

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def p95(self, which: str) -> float | None:
        return quantile(0.95, self.ttft if which == "ttft" else self.e2e)

    def as_dict(self) -> dict:
        rate = self.error_rate
        p_t, p_e = self.p95("ttft"), self.p95("e2e")
        return {"requests": int(self.requests), "errors": int(self.errors),
                "error_rate_pct": None if rate is None else round(100 * rate, 2),
                "p95_ttft_s": None if p_t is None else round(p_t, 4),
                "p95_e2e_s": None if p_e is None else round(p_e, 4)}

    def text(self) -> str:
        return figures_text(self.as_dict())


def figures_text(d: dict) -> str:
    """Figures as words (Figures.as_dict(), also as a rollout's record keeps them): a figure with
    no requests behind it is '-'."""
    rate = "-" if d["error_rate_pct"] is None else f"{d['error_rate_pct']:.1f}%"
    ttft = "-" if d["p95_ttft_s"] is None else f"{d['p95_ttft_s']:.2f}s"
    e2e = "-" if d["p95_e2e_s"] is None else f"{d['p95_e2e_s']:.2f}s"
    return f"{d['requests']} req, {rate} errors, p95 TTFT {ttft} e2e {e2e}"


def _buckets(samples: dict, metric: str) -> dict:
    out: dict = {}
    for (name, labels), v in samples.items():
        if name == metric + "_bucket":
            le = dict(labels).get("le")
            bound = math.inf if le in ("+Inf", "Inf") else host_number(le, 0, COUNT_MAX, decimal=True)
            if bound is None:
                continue
            out[bound] = out.get(bound, 0.0) + v
    return out


def figures_of(samples: dict) -> Figures:
    """Figures of one instance's counters (a delta over a window, or totals since it started)."""
    f = Figures()
    http = [(dict(labels), v) for (name, labels), v in samples.items() if name == HTTP]
    if http:
        for labels, v in http:
            if labels.get("handler", "").startswith(INFERENCE) and labels.get("method") == "POST":
                f.requests += v
                f.errors += v if labels.get("status", "").startswith("5") else 0.0
    else:
        f.requests = sum(v for (name, _), v in samples.items() if name == SUCCESS)
    f.ttft, f.e2e = _buckets(samples, TTFT), _buckets(samples, E2E)
    f.unreadable = int(samples.get(UNREADABLE, 0))
    return f


def _cumulative_at(hist: dict, x: float) -> float:
    """A histogram's cumulative count at `x`, linear inside the bucket holding it (0 at 0)."""
    lo, lo_count = 0.0, 0.0
    for bound in sorted(hist):
        if x <= bound:
            if bound == math.inf:
                return lo_count  # nothing is known inside +Inf: no interpolation there
            return lo_count + (hist[bound] - lo_count) * ((x - lo) / (bound - lo) if bound > lo else 1.0)
        lo, lo_count = bound, hist[bound]
    return lo_count


def merge_histograms(hists: list[dict]) -> dict:
    """Histograms of possibly different bucket bounds summed on the union of their bounds."""
    hists = [h for h in hists if h]
    if not hists:
        return {}
    bounds = sorted({b for h in hists for b in h} | {math.inf})
    return {b: sum(h.get(b, max(h.values())) if b == math.inf else _cumulative_at(h, b) for h in hists)
            for b in bounds}


def merge(figures: list[Figures]) -> Figures:
    return Figures(sum(f.requests for f in figures), sum(f.errors for f in figures),
                   merge_histograms([f.ttft for f in figures]), merge_histograms([f.e2e for f in figures]),
                   sum(f.unreadable for f in figures))


def quantile(q: float, hist: dict) -> float | None:
    """histogram_quantile(q) of {upper bound: cumulative count}: linear inside the bucket that
    holds the rank; in the +Inf bucket, the largest finite bound. None with no observation."""
    if not hist:
        return None
    bounds = sorted(hist)
    total = hist[bounds[-1]] if bounds[-1] == math.inf else max(hist.values())
    if total <= 0:
        return None
    rank = q * total
    lo, lo_count = 0.0, 0.0
    for bound in bounds:
        count = hist[bound]
        if count >= rank:
            if bound == math.inf:
                return lo
            return lo + (bound - lo) * ((rank - lo_count) / (count - lo_count) if count > lo_count else 1.0)
        lo, lo_count = bound, count
    return lo


class Window:
    """Samples of a set of instances over one window: add() each poll's /metrics per instance;
    figures() the sum of what every instance served since its first sample in the window."""

    def __init__(self) -> None:
        self.last: dict = {}
        self.added: dict = {}
        self.unreadable: dict = {}  # instance -> the most lines it could not read in one poll

    def add(self, instance: str, samples: dict) -> None:
        self.unreadable[instance] = max(self.unreadable.get(instance, 0), int(samples.get(UNREADABLE, 0)))
        prev, acc = self.last.get(instance), self.added.setdefault(instance, {})
        if prev is not None:  # add what was added since the last sample; all of it after a restart
            # a counter went down: the instance restarted, its counters began again at 0
            restarted = any(samples.get(k, 0.0) < v for k, v in prev.items())
            for k, v in samples.items():
                acc[k] = acc.get(k, 0.0) + (v if restarted else v - prev.get(k, 0.0))
        self.last[instance] = samples

    def figures(self) -> Figures:
        f = merge([figures_of(a) for a in self.added.values()])
        f.unreadable = sum(self.unreadable.values())  # a delta of them says nothing: any poll's count
        return f


# ---------------------------------------------------------------------------- verdict

@dataclass
class Slo:
    """The gate's rule. Defaults, and why (docs/fleet.md, "Canary gate"):
    error_points 1.0: one request in a hundred more than the baseline fails is what users notice
    and what a healthy vLLM never does (its 5xx are engine faults, not load);
    latency_ratio 1.5: p95s of two healthy hosts of one GPU class agree within a bucket (vLLM's
    buckets are about 1.3-2x apart in the range served), so 1.5x is the smallest ratio that is not
    bucket noise, while a release 2x slower is caught;
    min_requests 50: with fewer, one failed request is already 2 points (1 in 50), noise;
    on_thin "wait": thin traffic after a deploy is common; waiting costs time, not safety."""
    error_points: float = 1.0
    latency_ratio: float = 1.5
    min_requests: int = 50
    on_thin: str = "wait"
    canary_min: int = 0  # the canary's own minimum when a gateway gives it less than a host's share (0: min_requests)


def check_slo(slo: Slo) -> None:
    """One sentence per bad value (ValueError), naming the option and what it accepts."""
    if not (math.isfinite(slo.error_points) and 0 <= slo.error_points <= 100):
        raise ValueError(f"--slo-error-rate {slo.error_points} must be percentage points from 0 to 100")
    if not (math.isfinite(slo.latency_ratio) and slo.latency_ratio >= 1):
        raise ValueError(f"--slo-latency-ratio {slo.latency_ratio} must be a finite ratio of at least 1")
    if slo.min_requests < 1:
        raise ValueError(f"--slo-min-requests {slo.min_requests} must be at least 1")
    if slo.on_thin not in THIN_CHOICES:
        raise ValueError(f"--on-thin-traffic {slo.on_thin} must be one of {', '.join(THIN_CHOICES)}")


@dataclass
class Verdict:
    state: str  # "pass", "breach" or "thin"
    reason: str
    slo: str = ""  # which SLO broke: "error rate", "p95 TTFT", "p95 e2e latency"


def verdict(canary: Figures, baseline: Figures, slo: Slo) -> Verdict:
    """Compare the canary's window with the baseline's (see the module's rule). A side whose
    /metrics held a line the gate cannot read is a breach: the gate fails closed, never judging
    without it (an error counter of +Inf, left out, would read as no errors)."""
    for side, f in (("canary", canary), ("baseline", baseline)):
        if f.unreadable:
            return Verdict("breach", f"the {side}'s /metrics had {f.unreadable} sample line(s) the gate cannot read "
                                     "(a count that is no number: +Inf, 1e400, text): it cannot vouch for the batch",
                           "metrics")
    need = {"canary": slo.canary_min or slo.min_requests, "baseline": slo.min_requests}
    thin = [f"{side} {int(f.requests)} of {need[side]}" for side, f in (("canary", canary), ("baseline", baseline))
            if f.requests < need[side]]
    if thin:
        return Verdict("thin", f"too few requests to judge ({', '.join(thin)}; --slo-min-requests "
                               f"{slo.min_requests}{', scaled to the canary weight' if slo.canary_min else ''})")
    c_rate, b_rate = 100 * (canary.error_rate or 0.0), 100 * (baseline.error_rate or 0.0)
    limit = min(b_rate, slo.error_points) + slo.error_points
    if c_rate > limit:
        bad = " (the baseline itself fails more than that: held to it)" if b_rate > slo.error_points else ""
        return Verdict("breach", f"error rate: canary {c_rate:.2f}% vs baseline {b_rate:.2f}% (at most "
                                 f"+{slo.error_points:g} points: {limit:.2f}%){bad}", "error rate")
    for which, label in (("ttft", "p95 TTFT"), ("e2e", "p95 e2e latency")):
        c, b = canary.p95(which), baseline.p95(which)
        if c is None or b is None:
            continue
        if c > slo.latency_ratio * b and c - b > LATENCY_FLOOR:
            return Verdict("breach", f"{label}: canary {c:.3f}s vs baseline {b:.3f}s "
                                     f"({c / b if b else math.inf:.1f}x, at most {slo.latency_ratio:g}x)", label)
    return Verdict("pass", f"within the SLO: error rate {c_rate:.2f}% vs {b_rate:.2f}%, p95 TTFT "
                           f"{_s(canary.p95('ttft'))} vs {_s(baseline.p95('ttft'))}, e2e "
                           f"{_s(canary.p95('e2e'))} vs {_s(baseline.p95('e2e'))}")


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}s"


# ---------------------------------------------------------------------------- the remote read

@reads_host(lambda why, lines: ("", {}))
def split_instances(lines: list[str]) -> tuple[str, dict[str, str]]:
    """The metrics script's answer -> (GPU name, {instance: its /metrics text})."""
    gpu, cur = "", None
    out: dict[str, list[str]] = {}
    for ln in lines:
        if ln.startswith("@@gpu "):
            gpu = ln[6:].strip()
        elif ln.startswith("@@instance "):
            cur = ln[11:].strip()
            out[cur] = []
        elif cur is not None:
            out[cur].append(ln)
    return gpu, {k: "\n".join(v) for k, v in out.items()}
