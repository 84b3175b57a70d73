"""`wirespeed predict` without the CLI: fit each series of records, predict other layouts, sizes and
link rates, compare predictions with measurements, and write predicted records in the bench schema.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import UsageError
from ..report.records import record
from ..sizes import human_bytes
from . import fields as F
from .costs import algorithm_for, busbw_factor, count_for, terms
from .fit import PARAMS, MissingClass, Model, fit


@dataclass
class SeriesFit:
    key: tuple                  # fields.series_key
    records: list[dict]
    algo: str
    why: str                    # whose choice the algorithm is ("gloo's", "--algo")
    model: Model

    @property
    def backend(self) -> str:
        return self.key[0]

    @property
    def collective(self) -> str:
        return self.key[2]

    def title(self) -> str:
        backend, device, coll, dtype, op, inplace = self.key
        return (f"{coll} | {backend} | {device} | {dtype}{' ' + op if op else ''} | "
                f"{'in-place' if inplace else 'out-of-place'}")

    def layouts(self) -> list[F.Layout]:
        return sorted({F.layout_of(r) for r in self.records}, key=lambda l: (l.world, l.host_of))


def fit_all(records: list[dict], algo: str | None = None,
            measured_rate_bps: float | None = None) -> list[SeriesFit]:
    """One model per series (backend, device, collective, dtype, op, variant)."""
    measured = [r for r in records if not F.is_predicted(r)]
    if not measured:
        raise UsageError("the --from records are all predictions: fit on measured records")
    groups: dict[tuple, list[dict]] = {}
    for r in measured:
        if measured_rate_bps and not F.link_rate_bps(r) and F.layout_of(r).hosts > 1:
            r = {**r, "link_rate_gbps": measured_rate_bps / 1e9}
        groups.setdefault(F.series_key(r), []).append(r)
    fits = []
    for key, rs in groups.items():
        backend, coll = key[0], key[2]
        name, why = algorithm_for(backend, coll, algo)
        model = fit(rs, lambda r, c=coll, a=name: terms(c, a, F.layout_of(r), F.size_bytes(r))[0])
        fits.append(SeriesFit(key, rs, name, why, model))
    return fits


def usable_fits(fits: list[SeriesFit]) -> tuple[list[SeriesFit], list[str]]:
    """(the fits that may predict, a `# not predicted` line for each that may not: fit.py's
    Model.meaningless). None left is a one-line UsageError: printing predictions from a fit that
    cannot explain its own records, with exit 0, passes a guess off as a result."""
    good, notes = [], []
    for sf in fits:
        why = sf.model.meaningless()
        if why:
            notes.append(f"{sf.title()}: the fit has {why}")
        else:
            good.append(sf)
    if not good:
        raise UsageError(f"no meaningful fit to predict with: {notes[0]}: the records do not follow "
                         "latency + bytes / bandwidth; fit on runs whose sizes reach where bytes "
                         "dominate (e.g. --sizes 1M,4M,16M), on a quiet machine")
    return good, [f"# not predicted: {n}" for n in notes]


# The largest job predicted: a predicted record lists every rank's host (`layout`), and at this
# size that list is ~2 MiB, half the longest line report.records reads back.
MAX_RANKS = 1 << 18
# The model walks every rank of every step (ring: one step of n pairs; doubling and trees: log2 n
# steps); about 2 million rank-steps a second on a 2-core VM, so this is ~10 s of arithmetic.
MAX_RANK_STEPS = 2e7


def check_work(fits: list[SeriesFit], layouts: list[F.Layout], sizes: list[int] | None) -> None:
    """A UsageError, before any arithmetic, for what-ifs that would take minutes or more (the
    model's cost grows as n log n per size and series, and was unbounded: 1,000,000 ranks ran on
    with no output)."""
    big = max((l.world for l in layouts), default=0)
    calls = sum(len(sizes or sizes_of(sf)) for sf in fits)
    work = sum(l.world * max(1, l.world.bit_length()) for l in layouts) * calls
    if work > MAX_RANK_STEPS:
        raise UsageError(f"{len(layouts)} layout{'s' if len(layouts) != 1 else ''} up to {big} ranks "
                         f"x {calls} series-sizes is ~{work:.1e} rank-steps of arithmetic (refused "
                         f"above {MAX_RANK_STEPS:.0e}, ~10 s): give fewer --sizes or ranks")


def layouts_from_flags(nprocs: list[int] | None, hosts: list[int] | None,
                       ranks_per_host: int | None) -> list[F.Layout]:
    """The layouts to predict: --nprocs N (with --ranks-per-host K, default 1), or --hosts H, or
    both (then K = N / H). Each is sized before it is built: a layout lists every rank."""
    for n in [*(nprocs or ()), *((h * (ranks_per_host or 1)) for h in (hosts or ()) if not nprocs)]:
        if n > MAX_RANKS:
            raise UsageError(f"{n} ranks: predict {MAX_RANKS} ranks or fewer (a predicted record lists "
                             "every rank's host)")
    if nprocs and hosts:
        if len(nprocs) != 1 or len(hosts) != 1:
            raise UsageError("with both --nprocs and --hosts give one of each (or a list of only one)")
        n, h = nprocs[0], hosts[0]
        if n % h:
            raise UsageError(f"--nprocs {n} does not split evenly over --hosts {h}")
        if ranks_per_host and ranks_per_host != n // h:
            raise UsageError(f"--ranks-per-host {ranks_per_host} disagrees with --nprocs {n} / --hosts {h}")
        return [F.Layout.blocks(h, n // h)]
    k = ranks_per_host or 1
    if hosts:
        return [F.Layout.blocks(h, k) for h in hosts]
    if not nprocs:
        raise UsageError("say what to predict: --nprocs N (and --ranks-per-host K), or --hosts H")
    out = []
    for n in nprocs:
        if n % k:
            raise UsageError(f"--nprocs {n} is not a multiple of --ranks-per-host {k}")
        out.append(F.Layout.blocks(n // k, k))
    return out


def _missing_text(sf: SeriesFit, classes: list[str], layout: F.Layout) -> str:
    why = {"shm": f"{layout.per_host} ranks on one host need the cost inside a host, and no fitted "
                  "run had two ranks on one host: add one (e.g. `wirespeed bench -N 2` on one machine)",
           "net": f"{layout.hosts} hosts need the network's cost, and no fitted run crossed hosts: add "
                  "one (`wirespeed bench --cluster -N 2`, or a job on two machines)"}
    return f"cannot predict {sf.collective} ({sf.backend}) on {layout.describe()}: " + \
        "; ".join(why[c] for c in classes)


def predict_time(sf: SeriesFit, layout: F.Layout, nbytes: int, rate_bps: float | None) -> tuple[float, str]:
    t, desc = terms(sf.collective, sf.algo, layout, nbytes)
    if t.uses_net and sf.model.per_rate is False and rate_bps and sf.model.link_rate_bps is None:
        raise UsageError("--link-rate needs to know the rate the runs had: these records do not carry "
                         "one; give it with --measured-link-rate")
    try:
        return sf.model.time_us(t, _net_rate(sf.model, rate_bps)), desc
    except MissingClass as e:
        raise UsageError(_missing_text(sf, e.classes, layout)) from None


def _net_rate(model: Model, rate_bps: float | None) -> float | None:
    """The link rate to price network bytes at: the what-if rate, else the records' own."""
    return rate_bps or model.link_rate_bps


def _scaled_model(model: Model, rate_bps: float | None) -> Model:
    """A model fitted in us per byte, moved to another link rate (b scales with 1 / rate)."""
    if not rate_bps or model.per_rate or not model.link_rate_bps or model.params["b_net"] is None:
        return model
    p = dict(model.params)
    p["b_net"] = p["b_net"] * model.link_rate_bps / rate_bps
    return Model(params=p, per_rate=False, link_rate_bps=rate_bps, fit_rms=model.fit_rms,
                 fit_max=model.fit_max, worst=model.worst, residuals=model.residuals,
                 n_records=model.n_records, bytes_fitted=model.bytes_fitted)


def sizes_of(sf: SeriesFit) -> list[int]:
    return sorted({F.size_bytes(r) for r in sf.records})


def predicted_records(fits: list[SeriesFit], layouts: list[F.Layout], sizes: list[int] | None,
                      rate_bps: float | None = None) -> list[dict]:
    """Records in the bench schema, marked `"predicted": true`, one per series x layout x size."""
    run_id = "predict-" + time.strftime("%Y%m%d-%H%M%S")
    out = []
    for sf in fits:
        backend, device, coll, dtype, op, inplace = sf.key
        model = _scaled_model(sf.model, rate_bps)
        view = SeriesFit(sf.key, sf.records, sf.algo, sf.why, model)
        root = sf.records[0].get("root", -1)
        for layout in layouts:
            for nbytes in (sizes or sizes_of(sf)):
                if coll == "barrier":
                    nbytes = 0
                t_us, desc = predict_time(view, layout, nbytes, rate_bps)
                n = layout.world
                algbw = nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
                factor = busbw_factor(coll, n)
                rate = _net_rate(model, rate_bps) if layout.hosts > 1 else None
                rec = record("bench", {"run_id": run_id, "collective": coll, "backend": backend,
                       "dtype": dtype, "op": op, "device": device, "world_size": n, "root": root,
                       "bytes": nbytes, "count": count_for(coll, nbytes, F.ITEMSIZE.get(dtype, 4), n),
                       "inplace": inplace, "time_us": t_us, "algbw_gbps": algbw,
                       "busbw_gbps": algbw * factor, "busbw_factor": factor, "wrong": 0,
                       "checked": False, "predicted": True, "hosts": layout.hosts,
                       "ranks_per_host": layout.per_host, "layout": list(layout.host_of),
                       "model": model_summary(view, desc)})
                if rate:
                    rec["link_rate_gbps"] = rate / 1e9
                out.append(rec)
                if coll == "barrier":
                    break
    return out


def model_summary(sf: SeriesFit, desc: str) -> dict:
    m = sf.model
    return {"algorithm": desc, "algo": sf.algo, "chosen_by": sf.why, "params": m.params,
            "b_net_per_link_rate": m.per_rate, "fit_rms": m.fit_rms, "fit_max": m.fit_max,
            "fitted_records": m.n_records,
            "fitted_layouts": [l.describe() for l in sf.layouts()]}


def describe_params(sf: SeriesFit) -> list[str]:
    """The fitted parameters in words, with their units, and the fit error."""
    p, m = sf.model.params, sf.model
    lines = []
    if p["a_shm"] is not None:
        gbps = 1e-3 / p["b_shm"] if p["b_shm"] else float("inf")
        lines.append(f"shm (inside a host): latency {p['a_shm']:.1f} us per step, "
                     f"{p['b_shm'] * 1e3:.4f} ns/B ({gbps:.2f} GB/s)")
    else:
        lines.append("shm (inside a host): not fitted (no run had two ranks on one host)")
    if p["a_net"] is not None:
        if m.per_rate:
            share = 1 / p["b_net"] if p["b_net"] else float("inf")
            rate = m.link_rate_bps
            lines.append(f"net (between hosts): latency {p['a_net']:.1f} us per step, bytes at "
                         f"{share:.3f} of the link rate ({share * rate / 8e9:.3f} GB/s on the records' "
                         f"{rate / 1e9:g} Gbit/s)")
        else:
            gbps = 1e-3 / p["b_net"] if p["b_net"] else float("inf")
            lines.append(f"net (between hosts): latency {p['a_net']:.1f} us per step, "
                         f"{p['b_net'] * 1e3:.4f} ns/B ({gbps:.3f} GB/s; the records do not say "
                         "their link rate)")
    else:
        lines.append("net (between hosts): not fitted (no run crossed hosts)")
    w = m.worst
    lines.append(f"fit error over {m.n_records} records: rms {m.fit_rms:.1%}, max {m.fit_max:.1%} "
                 f"({human_bytes(w['bytes'])} on {w['world_size']} ranks)")
    return lines


def render(fits: list[SeriesFit], preds: list[dict]) -> str:
    lines = []
    for sf in fits:
        mine = [r for r in preds if F.series_key(r) == sf.key]
        lines.append(f"# {sf.title()}")
        lines.append(f"# fitted on {', '.join(l.describe() + f' ({l.world} ranks)' for l in sf.layouts())}"
                     f" (hosts x ranks per host); algorithm: {sf.algo} ({sf.why})")
        lines += [f"#   {t}" for t in describe_params(sf)]
        lines.append(f"#{'size':>11} {'ranks':>6} {'hosts':>6} {'time':>12} {'algbw':>8} {'busbw':>8} "
                     f"{'bw/link':>8}  algorithm")
        lines.append(f"#{'(B)':>11} {'':>6} {'':>6} {'(us)':>12} {'(GB/s)':>8} {'(GB/s)':>8} {'':>8}")
        for r in mine:
            link = r.get("link_rate_gbps")
            ratio = f"{r['busbw_gbps'] * 8 / link:.3f}" if link and r["busbw_gbps"] else "-"
            lines.append(f"{r['bytes']:>12} {r['world_size']:>6} {r['hosts']:>4}x{r['ranks_per_host']:<1} "
                         f"{r['time_us']:>12.1f} {r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} "
                         f"{ratio:>8}  {r['model']['algorithm']}")
        lines.append("")
    lines.append("# predicted, not measured: time = sum over link classes of steps x latency + bytes on "
                 "the busiest link x per-byte cost (docs/predict.md); bw/link = busbw x 8 / link Gbit/s")
    return "\n".join(lines)


@dataclass
class Check:
    key: tuple
    layout: F.Layout
    nbytes: int
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_us - self.measured_us) / self.measured_us


def check_against(fits: list[SeriesFit], measured: list[dict], sizes_min: int = 0) -> list[Check]:
    """Predict every measured record's own layout, size and link rate, for a side-by-side."""
    by_key = {sf.key: sf for sf in fits}
    out = []
    for r in measured:
        sf = by_key.get(F.series_key(r))
        if sf is None or F.is_predicted(r) or F.size_bytes(r) < sizes_min or F.time_us(r) <= 0:
            continue
        layout = F.layout_of(r)
        t, _ = predict_time(sf, layout, F.size_bytes(r), F.link_rate_bps(r) if sf.model.per_rate else None)
        out.append(Check(sf.key, layout, F.size_bytes(r), F.time_us(r), t))
    return out


def render_checks(checks: list[Check]) -> str:
    if not checks:
        return "# --against: no measured record matches a fitted series (same backend, collective, dtype, op)"
    lines = ["# predicted against measured (error = (predicted - measured) / measured)",
             f"#{'size':>11} {'ranks':>6} {'hosts':>6} {'measured':>12} {'predicted':>12} {'error':>8}",
             f"#{'(B)':>11} {'':>6} {'':>6} {'(us)':>12} {'(us)':>12}"]
    for c in sorted(checks, key=lambda c: (c.key, c.layout.world, c.nbytes)):
        lines.append(f"{c.nbytes:>12} {c.layout.world:>6} {c.layout.describe():>6} {c.measured_us:>12.1f} "
                     f"{c.predicted_us:>12.1f} {c.error:>+8.1%}")
    worst = max(checks, key=lambda c: abs(c.error))
    lines.append(f"# worst: {worst.error:+.1%} at {human_bytes(worst.nbytes)} on {worst.layout.world} ranks")
    return "\n".join(lines)


__all__ = ["PARAMS", "SeriesFit", "fit_all", "layouts_from_flags", "predicted_records", "render",
           "check_against", "render_checks"]
