"""bench/compare's report: statistics over runs, table.md's sections (the main tables, shm, many
connections, the targets and aims), summary rows and the gnuplot figure.
"""
import os
import shutil
import statistics
import subprocess

from compare_lib.common import KIB, MIB, log, size_name


def stats(vals):
    v = [x for x in vals if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt(x):
    if x is None:
        return "–"
    a = abs(x)
    return f"{x:.0f}" if a >= 100 else f"{x:.1f}" if a >= 10 else f"{x:.2f}" if a >= 0.1 else f"{x:.3f}"


def cell(st, reason=None):
    if st is None:
        return f"n/a: {reason}" if reason else "n/a"
    return f"{fmt(st['median'])} [{fmt(st['min'])}–{fmt(st['max'])}]"


def ratio(a, b):
    if a is None or b is None or not b["median"]:
        return None
    return a["median"] / b["median"]


def rfmt(x):
    return "–" if x is None else f"{x:.2f}×"


def many_section(e, pn, counts, provs, get, why):
    """The many-connection curve: each count's median against the 1-QP row of the same run."""
    L = ["Many connections (issue 15): `conveyor perf --qps N`; 4 KiB WRITE bandwidth summed over N QPs "
         "(`--tx-depth 16 --batch 16 --slots 1` each) and the 8 B READ round trip taking the next QP each time. "
         "Flat means within 0.8× (bandwidth) and 1.25× (latency) of one QP.", ""]
    head = "| QPs |" + "".join(f" {p} 4 KiB WRITE MB/s | ×1 QP | {p} 8 B READ µs | ×1 QP |" for p in provs)
    tcp = any(get(e, pn, "many", f"tcp-q{n}", "pingpong lat", 8) is not None for n in counts)
    if tcp:
        head += " raw TCP 8 B ping-pong µs | ×1 conn | soft READ ×TCP |"
    L += [head, "|---|" + "---|---|---|---|" * len(provs) + ("---|---|---|" if tcp else "")]
    verdicts, against_tcp = [], []
    for n in counts:
        cells = []
        for p in provs:
            bw, lat = get(e, pn, "many", f"{p}-q{n}", "write bw", 4 * KIB), get(e, pn, "many", f"{p}-q{n}", "read lat", 8)
            bw1, lat1 = get(e, pn, "many", f"{p}-q1", "write bw", 4 * KIB), get(e, pn, "many", f"{p}-q1", "read lat", 8)
            rb, rl = ratio(bw, bw1), ratio(lat, lat1)
            cells += [cell(bw, why(e, pn, "many", f"{p}-q{n}", "write bw", 4 * KIB)), rfmt(rb),
                      cell(lat, why(e, pn, "many", f"{p}-q{n}", "read lat", 8)), rfmt(rl)]
            if n != 1:
                verdicts.append(f"{p} {n} QPs: bandwidth {'flat' if rb is not None and rb >= 0.8 else 'NOT flat'}, "
                                f"latency {'flat' if rl is not None and rl <= 1.25 else 'NOT flat'}")
        if tcp:
            t, t1 = get(e, pn, "many", f"tcp-q{n}", "pingpong lat", 8), get(e, pn, "many", "tcp-q1", "pingpong lat", 8)
            soft_lat = get(e, pn, "many", f"soft-q{n}", "read lat", 8)
            cells += [cell(t, why(e, pn, "many", f"tcp-q{n}", "pingpong lat", 8)), rfmt(ratio(t, t1)),
                      rfmt(ratio(soft_lat, t))]
            if ratio(soft_lat, t) is not None:
                against_tcp.append(f"{n}: {rfmt(ratio(soft_lat, t))}")
        L.append(f"| {n} | " + " | ".join(cells) + " |")
    L += ["", "; ".join(verdicts) + "."]
    if against_tcp:
        L.append("soft's READ round trip against raw TCP's ping-pong over as many connections: " +
                 ", ".join(against_tcp) + ".")
    L.append("")
    return L


def summarize(samples):
    groups = {}
    for s in samples:
        groups.setdefault((s["env"], s["pinning"], s["section"], s["peer"], s["metric"], s["size"]), []).append(s)
    out = {}
    for k, g in groups.items():
        st = stats([s["value"] for s in g])
        st["cpu"] = stats([s["cpu_per_gb"] for s in g])
        out[k] = st
    return out


UNITS = {"bw": "MB/s", "lat": "µs round trip, p50", "rate": "Mops/s"}


def build_report(a, configs, na_config, samples, errors, sizes, machine, conveyor_src, elapsed, over_budget):
    summ = summarize(samples)
    L = []
    L.append(f"# bench/compare — {machine}")
    L.append("")
    L.append(f"{a.runs} runs per measurement, {a.duration} s each; median [min–max] of the runs; MB/s = 10^6 B/s; "
             f"Conveyor through {conveyor_src}; total time {elapsed:.0f} s"
             + (" (time budget reached: some rows skipped)" if over_budget else "") + ".")
    L.append("")

    def get(e, pn, sec, peer, metric, size):
        return summ.get((e, pn, sec, peer, metric, size))

    def why(e, pn, sec, peer, metric, size):
        return errors.get((e, pn, sec, peer, metric, size))

    targets = []
    for e, pn, pc in configs:
        title = f"## {e}, client and server {'on CPUs %d and %d' % pc if pn == 'split' else 'sharing CPU %d' % pc[0]}"
        L.append(title)
        L.append("")
        if (e, pn) in na_config:
            L.append(f"n/a: {na_config[(e, pn)]}")
            L.append("")
            continue
        if a.shm_only:
            L += shm_section(e, pn, sizes, get, why)
            continue
        L.append("| measurement | unit | Conveyor soft | raw TCP | libfabric tcp | UCX tcp | ×TCP | ×libfabric | ×UCX |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        rows = []
        for metric in ("write bw", "read bw"):
            for s in sizes:
                rows.append((f"{metric.split()[0].upper()} bandwidth {size_name(s)}", "bw", metric, s,
                             ("tcp", "write bw"), True))
        for s in sizes:
            rows.append((f"WRITE ping-pong {size_name(s)}", "lat", "write lat", s, ("tcp", "write lat"), False))
        rows.append(("READ round trip 8 B", "lat", "read lat", 8, ("tcp", "write lat"), False))
        rows.append(("8 B WRITE message rate", "rate", "write rate", 8, ("tcp", "write bw"), True))
        for name, kind, metric, s, (tp, tm), hib in rows:
            c = get(e, pn, "net", "conveyor", metric, s)
            if kind == "rate":
                tcp_s = get(e, pn, "net", "tcp", "write bw", 8)
                t = None
                if tcp_s:  # 8-byte send() calls per second
                    vals = [x["result"]["mops"] for x in samples if (x["env"], x["pinning"], x["peer"], x["metric"],
                            x["size"]) == (e, pn, "tcp", "write bw", 8)]
                    t = stats(vals)
            else:
                t = get(e, pn, "net", tp, tm, s)
            f = get(e, pn, "net", "fi", metric, s)
            u = get(e, pn, "net", "ucx", metric, s)
            L.append(f"| {name} | {UNITS[kind]} | {cell(c, why(e, pn, 'net', 'conveyor', metric, s))} | "
                     f"{cell(t, why(e, pn, 'net', tp, tm, s))} | {cell(f, why(e, pn, 'net', 'fi', metric, s))} | "
                     f"{cell(u, why(e, pn, 'net', 'ucx', metric, s))} | {rfmt(ratio(c, t))} | {rfmt(ratio(c, f))} | "
                     f"{rfmt(ratio(c, u))} |")
            if e == "loopback":
                targets.append((e, pn, name, kind, s, c, t, f, u))
        b = get(e, pn, "net", "tcp-block", "write lat", 8)
        L.append(f"| raw TCP 8 B ping-pong, blocking recv (reference) | µs | – | "
                 f"{cell(b, why(e, pn, 'net', 'tcp-block', 'write lat', 8))} | – | – | – | – | – |")
        for s in [x for x in sizes if x >= 4 * KIB]:
            b = get(e, pn, "net", "tcp-block", "write bw", s)
            L.append(f"| raw TCP stream {size_name(s)}, blocking send/recv (reference) | MB/s | – | "
                     f"{cell(b, why(e, pn, 'net', 'tcp-block', 'write bw', s))} | – | – | – | – | – |")
        L.append("")
        mc = [(s, get(e, pn, "net", "memcpy", "memcpy bw", s)) for s in sizes]
        if any(m for _, m in mc):
            L.append("Limit, single-thread memcpy (MB/s): " + "; ".join(f"{size_name(s)} {cell(m)}" for s, m in mc if m))
            L.append("")
        L.append("CPU, user+sys of both processes per GB moved (s/GB):")
        L.append("")
        L.append("| transfer | Conveyor soft | raw TCP | libfabric tcp | UCX tcp (whole processes) | ×TCP |")
        L.append("|---|---|---|---|---|---|")
        for metric in ("write bw", "read bw"):
            for s in [x for x in sizes if x >= 64 * KIB]:
                g = lambda p, m=metric: (get(e, pn, "net", p, m, s) or {}).get("cpu")
                c, t, f, u = g("conveyor"), g("tcp", "write bw"), g("fi"), g("ucx")
                L.append(f"| {metric.split()[0].upper()} {size_name(s)} | {cell(c, 'not reported')} | {cell(t)} | "
                         f"{cell(f)} | {cell(u)} | {rfmt(ratio(c, t))} |")
                if e == "loopback":
                    targets.append((e, pn, f"CPU/GB {metric.split()[0].upper()} {size_name(s)}", "cpu", s, c, t, None, None))
        L.append("")
        if e == "loopback" and pn == "split" and not a.no_shm:
            L += shm_section(e, pn, sizes, get, why)
        if e == "loopback" and pn == "split" and a.qps_counts:
            seen = {k[3].rsplit("-q", 1)[0] for k in list(summ) + list(errors) if k[2] == "many"}
            provs = [p for p in ("soft", "shm") if p in seen]
            if provs:
                L += many_section(e, pn, a.qps_counts, provs, get, why)
    if not a.shm_only:
        L += target_section(targets)
        L.append("")
        L += aims15_section(targets)
        L.append("")
    L.append("n/a reasons are per measurement; raw samples are in results.json / samples.csv.")
    return "\n".join(L) + "\n"


def shm_section(e, pn, sizes, get, why):
    L = ["Shared memory (one host; issue 5):", "",
         "Conveyor shm: every one-sided operation validated and executed by the target's engine "
         "(CONVEYOR_SHM_DIRECT=off); Conveyor direct: the initiator maps the target's region "
         "(`conveyor perf` allocates it with allocate_memory) and serves it itself. Bandwidth rows run "
         "`--tx-depth 8 --batch 4 --slots 1` (one buffer each side, as the peers).", "",
         "| measurement | unit | Conveyor shm | Conveyor direct | bare limit | libfabric shm | UCX posix | UCX sysv | UCX posix,cma | ×limit | ×libfabric | direct ×UCX posix |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    marks = []
    for t in ("write", "read"):
        for s in sizes:
            lim = f"cma-{t}"
            ps = ("conveyor-shm", "conveyor-direct", lim, "fi-shm", "ucx-posix", "ucx-sysv", "ucx-cma")
            row = [get(e, pn, "shm", p, f"{t} bw", s) for p in ps]
            rs = [why(e, pn, "shm", p, f"{t} bw", s) for p in ps]
            if not any(row) and not any(rs):
                continue  # not measured at this size (--quick)
            L.append(f"| {t.upper()} bandwidth {size_name(s)} (limit: process_vm_{'readv' if t == 'read' else 'writev'}) "
                     f"| MB/s | " + " | ".join(cell(x, r or ('no Conveyor shm device' if i < 2 else None))
                                           for i, (x, r) in enumerate(zip(row, rs)))
                     + f" | {rfmt(ratio(row[0], row[2]))} | {rfmt(ratio(row[0], row[3]))} | {rfmt(ratio(row[1], row[4]))} |")
            if s in (MIB, 8 * MIB):
                marks.append((f"shm {t.upper()} bw {size_name(s)} ≥0.8× process_vm and > libfabric shm",
                              row[0], row[2], row[3], True, 0.8))
            if s in (64 * KIB, 8 * MIB):
                marks.append((f"direct {t.upper()} bw {size_name(s)} ≥0.9× UCX posix", row[1], row[4], None, True, 0.9))
    for t in ("write", "read"):
        row = [get(e, pn, "shm", p, f"{t} lat", 8) for p in ("conveyor-shm", "conveyor-direct")] + \
              [get(e, pn, "shm", "shm-pingpong", "write lat", 8)] + \
              [get(e, pn, "shm", p, f"{t} lat", 8) for p in ("fi-shm", "ucx-posix", "ucx-sysv", "ucx-cma")]
        L.append(f"| 8 B {t.upper()} round trip (limit: bare shared-memory ping-pong) | µs | "
                 + " | ".join(cell(x, 'no Conveyor shm device' if i < 2 and x is None else None) for i, x in enumerate(row))
                 + f" | {rfmt(ratio(row[0], row[2]))} | {rfmt(ratio(row[0], row[3]))} | {rfmt(ratio(row[1], row[4]))} |")
        marks.append((f"shm 8 B {t.upper()} round trip ≤3× bare ping-pong and < libfabric shm", row[0], row[2], row[3],
                      False, 3.0))
        marks.append((f"direct 8 B {t.upper()} latency ≤ UCX posix", row[1], row[4], None, False, 1.0))
    row = [get(e, pn, "shm", p, "write rate", 8) for p in ("conveyor-shm", "conveyor-direct", "fi-shm", "ucx-posix")]
    L.append(f"| 8 B WRITE message rate | Mops/s | {cell(row[0])} | {cell(row[1])} | – | {cell(row[2])} | {cell(row[3])} | – | – | – | "
             f"{rfmt(ratio(row[0], row[2]))} | {rfmt(ratio(row[1], row[3]))} |")
    L.append("")
    L.append("| shm target | result |")
    L.append("|---|---|")
    for name, c, lim, fi, hib, k in marks:
        if c is None:
            L.append(f"| {name} | n/a: no Conveyor shm measurement |")
            continue
        r1 = ratio(c, lim)
        ok1 = r1 is not None and (r1 >= k if hib else r1 <= k)
        if name.startswith("direct"):  # one peer (UCX posix), no libfabric clause
            L.append(f"| {name} | {rfmt(r1)}: {'met' if ok1 else 'MISSED'} |")
            continue
        r2 = ratio(c, fi)
        ok2 = r2 is not None and (r2 > 1 if hib else r2 < 1)
        L.append(f"| {name} | {rfmt(r1)}, {rfmt(r2)}: {'met' if ok1 and ok2 else 'MISSED'} |")
    L.append("")
    return L


def target_section(targets):
    """The targets of issue 3 (soft provider over loopback), pass/miss from the same run."""
    L = ["## Targets of issue 3 (soft provider, loopback)", "",
         "| pinning | target | Conveyor | ratios | |", "|---|---|---|---|---|"]
    for e, pn, name, kind, s, c, t, f, u in targets:
        checks = []
        if kind == "bw" and s in (MIB, 8 * MIB):
            checks = [("≥0.9× raw TCP", ratio(c, t), lambda r: r >= 0.9), ("> libfabric", ratio(c, f), lambda r: r > 1)]
        elif kind == "lat" and s == 8:
            checks = [("≤1.2× TCP busy ping-pong", ratio(c, t), lambda r: r <= 1.2),
                      ("< libfabric", ratio(c, f), lambda r: r < 1), ("< UCX", ratio(c, u), lambda r: r < 1)]
        elif kind == "rate":
            checks = [("> libfabric", ratio(c, f), lambda r: r > 1), ("> UCX", ratio(c, u), lambda r: r > 1)]
        elif kind == "cpu" and s in (MIB, 8 * MIB):
            checks = [("≤1.3× raw TCP", ratio(c, t), lambda r: r <= 1.3)]
        if checks:
            L.append(verdict_row(pn, name, c, checks, n_a_name=f"{name}: {'; '.join(x[0] for x in checks)}"))
    return L


def verdict_row(pn, name, c, checks, n_a_name=None):
    """One met/MISSED table row: checks are (label, ratio or None, test of the ratio)."""
    if c is None:
        return f"| {pn} | {n_a_name or name} | n/a | – | n/a |"
    parts, ok, unknown = [], True, False
    for label, r, test in checks:
        if r is None:
            unknown = True
            parts.append(f"{label}: n/a")
        else:
            good = test(r)
            ok &= good
            parts.append(f"{label}: {rfmt(r)} {'✓' if good else '✗'}")
    verdict = "MISSED" if not ok else ("met (partly n/a)" if unknown else "met")
    return f"| {pn} | {name} | {fmt(c['median'])} | {'; '.join(parts)} | {verdict} |"


def aims15_section(targets):
    """Issue 15's aims for soft over loopback, met or missed in this run (the shm and many-connection
    aims are read off their own tables above)."""
    L = ["## Aims of issue 15 (soft provider, loopback)", "",
         "| pinning | row | Conveyor | ratios | |", "|---|---|---|---|---|"]
    for e, pn, name, kind, s, c, t, f, u in targets:
        shared = pn != "split"
        checks = []
        if kind == "lat" and s == 8:
            checks = [("≤1.5× raw TCP on the same core", ratio(c, t), lambda r: r <= 1.5)] if shared else \
                     [("≤1.1× raw TCP", ratio(c, t), lambda r: r <= 1.1), ("< libfabric", ratio(c, f), lambda r: r < 1)]
        elif kind == "bw" and s >= 4 * KIB:
            if shared:
                checks = [("≥0.8× raw TCP", ratio(c, t), lambda r: r >= 0.8)]
            else:
                checks = [("≥1.0× raw TCP", ratio(c, t), lambda r: r >= 1.0)]
                if s in (MIB, 8 * MIB):
                    checks.append(("> libfabric", ratio(c, f), lambda r: r > 1))
        elif kind == "cpu" and not shared:
            checks = [("≤1.2× raw TCP", ratio(c, t), lambda r: r <= 1.2)]
        if checks:
            L.append(verdict_row(pn, name, c, checks))
    return L


def plot(out, summ, sizes):
    """compare.png: bandwidth vs size and latency vs size, loopback with client and server on two cores."""
    if not shutil.which("gnuplot"):
        log("compare: no gnuplot (apt install gnuplot-nox): no plot")
        return
    series = [("Conveyor soft WRITE", "net", "conveyor", "write bw"), ("raw TCP stream", "net", "tcp", "write bw"),
              ("libfabric tcp WRITE", "net", "fi", "write bw"), ("UCX tcp put", "net", "ucx", "write bw"),
              ("Conveyor soft READ", "net", "conveyor", "read bw"), ("libfabric tcp READ", "net", "fi", "read bw"),
              ("memcpy", "net", "memcpy", "memcpy bw")]
    shm = [("Conveyor shm WRITE", "shm", "conveyor-shm", "write bw"), ("Conveyor shm READ", "shm", "conveyor-shm", "read bw"),
           ("Conveyor direct WRITE", "shm", "conveyor-direct", "write bw"),
           ("Conveyor direct READ", "shm", "conveyor-direct", "read bw"),
           ("process_vm_writev", "shm", "cma-write", "write bw"), ("process_vm_readv", "shm", "cma-read", "read bw"),
           ("libfabric shm WRITE", "shm", "fi-shm", "write bw"), ("libfabric shm READ", "shm", "fi-shm", "read bw"),
           ("UCX posix put", "shm", "ucx-posix", "write bw"), ("UCX posix get", "shm", "ucx-posix", "read bw"),
           ("memcpy", "net", "memcpy", "memcpy bw")]
    lat = [("Conveyor soft WRITE", "net", "conveyor", "write lat"), ("raw TCP ping-pong (busy)", "net", "tcp", "write lat"),
           ("libfabric tcp WRITE", "net", "fi", "write lat"), ("UCX tcp put", "net", "ucx", "write lat")]
    files = []
    for panel, lst in (("bw", series), ("lat", lat), ("shm", shm)):
        for i, (title, sec, peer, metric) in enumerate(lst):
            pts = [(s, summ[k]) for s in sizes if (k := ("loopback", "split", sec, peer, metric, s)) in summ]
            if len(pts) < 1:
                continue
            fn = os.path.join(out, f"plot-{panel}-{i}.dat")
            with open(fn, "w") as f:
                for s, st in pts:
                    f.write(f"{s} {st['median']} {st['min']} {st['max']}\n")
            files.append((panel, fn, title))
    if not files:
        return
    panels = [p for p in ("bw", "lat", "shm") if any(f[0] == p for f in files)]
    width = 700 * len(panels)
    g = [f'set terminal pngcairo size {width},600 font ",10" noenhanced' if gnuplot_has("pngcairo")
         else f"set terminal png size {width},600",
         f"set output '{os.path.join(out, 'compare.png')}'", f"set multiplot layout 1,{len(panels)}",
         "set logscale xy", "set grid", "set key bottom right", "set xlabel 'message size (bytes)'",
         "set xtics ('8' 8, '4K' 4096, '64K' 65536, '1M' 1048576, '8M' 8388608)"]
    for panel, ylabel, ttl in (("bw", "MB/s (10^6 B/s)", "bandwidth over TCP, loopback, 2 cores"),
                               ("lat", "round trip, p50 (µs)", "latency over TCP, loopback, 2 cores"),
                               ("shm", "MB/s (10^6 B/s)", "bandwidth, shared memory, 2 cores")):
        if panel not in panels:
            continue
        fs = [(fn, t) for p, fn, t in files if p == panel]
        g.append("set key top left" if panel == "lat" else "set key bottom right")
        g.append(f"set title '{ttl}'")
        g.append(f"set ylabel '{ylabel}'")
        if fs:
            g.append("plot " + ", ".join(f"'{fn}' using 1:2:3:4 with yerrorlines title '{t}'" for fn, t in fs))
    g.append("unset multiplot")
    r = subprocess.run(["gnuplot"], input="\n".join(g), text=True, capture_output=True)
    if r.returncode != 0:
        log("compare: gnuplot failed: " + r.stderr.strip()[-300:])


def gnuplot_has(term):
    r = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    return term in (r.stdout + r.stderr)
