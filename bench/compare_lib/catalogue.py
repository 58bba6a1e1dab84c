"""What bench/compare measures: the list of (configuration, peer, test, size) cells for the main
tables and the many-connection rows, and how a result becomes the number a table shows.
"""
from compare_lib.common import KIB, MIB
from compare_lib.peers import lat_rtt, m_conveyor, m_fi, m_limit, m_tcp, m_ucx


def catalogue(sizes, shm_conveyor, lat_sweep, with_memcpy, with_shm, shm_bw_sizes=None):
    """(section, peer label, metric, size, function(ctx)) for one configuration. Latency at every size
    (the plot's sweep) only where lat_sweep; elsewhere at 8 B. Shared-memory bandwidth at shm_bw_sizes
    (default: every size)."""
    net, shm = [], []
    for s in sizes:
        for t in ("write", "read"):
            net.append(("net", "conveyor", f"{t} bw", s, lambda c, t=t, s=s: m_conveyor(c, "soft", t, "bw", s)))
            net.append(("net", "tcp", f"{t} bw", s, lambda c, s=s: m_tcp(c, "stream", s, "busy")) if t == "write" else None)
            net.append(("net", "tcp-block", f"{t} bw", s, lambda c, s=s: m_tcp(c, "stream", s, "block"))
                       if t == "write" and s >= 4 * KIB else None)
            net.append(("net", "fi", f"{t} bw", s, lambda c, t=t, s=s: m_fi(c, "tcp", t, "bw", s)))
            net.append(("net", "ucx", f"{t} bw", s, lambda c, t=t, s=s: m_ucx(c, "tcp", t, "bw", s)))
        if lat_sweep or s == 8:
            net.append(("net", "conveyor", "write lat", s, lambda c, s=s: m_conveyor(c, "soft", "write", "lat", s)))
            net.append(("net", "tcp", "write lat", s, lambda c, s=s: m_tcp(c, "pingpong", s, "busy")))
            net.append(("net", "fi", "write lat", s, lambda c, s=s: m_fi(c, "tcp", "write", "lat", s)))
            net.append(("net", "ucx", "write lat", s, lambda c, s=s: m_ucx(c, "tcp", "write", "lat", s)))
        if with_memcpy:
            net.append(("net", "memcpy", "memcpy bw", s, lambda c, s=s: m_limit(c, "memcpy", s)))
    if 8 in sizes:
        net += [
            ("net", "conveyor", "read lat", 8, lambda c: m_conveyor(c, "soft", "read", "lat", 8)),
            ("net", "fi", "read lat", 8, lambda c: m_fi(c, "tcp", "read", "lat", 8)),
            ("net", "ucx", "read lat", 8, lambda c: m_ucx(c, "tcp", "read", "lat", 8)),
            ("net", "tcp-block", "write lat", 8, lambda c: m_tcp(c, "pingpong", 8, "block")),
            ("net", "conveyor", "write rate", 8, lambda c: m_conveyor(c, "soft", "write", "rate", 8)),
            ("net", "fi", "write rate", 8, lambda c: m_fi(c, "tcp", "write", "rate", 8)),
            ("net", "ucx", "write rate", 8, lambda c: m_ucx(c, "tcp", "write", "rate", 8)),
        ]
    net = [m for m in net if m is not None]
    # Shared memory (issue 5): one host, no network; loopback, two cores only.
    for s in (sizes if shm_bw_sizes is None else shm_bw_sizes) if with_shm else []:
        for t in ("write", "read"):
            if shm_conveyor:
                shm.append(("shm", "conveyor-shm", f"{t} bw", s, lambda c, t=t, s=s: m_conveyor(c, "shm-engine", t, "bw", s)))
                shm.append(("shm", "conveyor-direct", f"{t} bw", s, lambda c, t=t, s=s: m_conveyor(c, "shm", t, "bw", s)))
            shm.append(("shm", f"cma-{t}", f"{t} bw", s, lambda c, t=t, s=s: m_limit(c, f"cma-{t}", s)))
            shm.append(("shm", "fi-shm", f"{t} bw", s, lambda c, t=t, s=s: m_fi(c, "shm", t, "bw", s)))
            for tls, label in (("posix", "ucx-posix"), ("sysv", "ucx-sysv"), ("posix,cma", "ucx-cma")):
                if tls == "posix" or s in (64 * KIB, 8 * MIB):  # the other two at issue 5's target sizes
                    shm.append(("shm", label, f"{t} bw", s, lambda c, t=t, s=s, tls=tls: m_ucx(c, tls, t, "bw", s)))
    if 8 in sizes and with_shm:
        for t in ("write", "read"):
            if shm_conveyor:
                shm.append(("shm", "conveyor-shm", f"{t} lat", 8, lambda c, t=t: m_conveyor(c, "shm-engine", t, "lat", 8)))
                shm.append(("shm", "conveyor-direct", f"{t} lat", 8, lambda c, t=t: m_conveyor(c, "shm", t, "lat", 8)))
            shm.append(("shm", "fi-shm", f"{t} lat", 8, lambda c, t=t: m_fi(c, "shm", t, "lat", 8)))
            for tls, label in (("posix", "ucx-posix"), ("sysv", "ucx-sysv"), ("posix,cma", "ucx-cma")):
                shm.append(("shm", label, f"{t} lat", 8, lambda c, t=t, tls=tls: m_ucx(c, tls, t, "lat", 8)))
        shm.append(("shm", "shm-pingpong", "write lat", 8, lambda c: m_limit(c, "shm-pingpong", 8)))
        if shm_conveyor:
            shm.append(("shm", "conveyor-shm", "write rate", 8, lambda c: m_conveyor(c, "shm-engine", "write", "rate", 8)))
            shm.append(("shm", "conveyor-direct", "write rate", 8, lambda c: m_conveyor(c, "shm", "write", "rate", 8)))
        shm.append(("shm", "fi-shm", "write rate", 8, lambda c: m_fi(c, "shm", "write", "rate", 8)))
        shm.append(("shm", "ucx-posix", "write rate", 8, lambda c: m_ucx(c, "posix", "write", "rate", 8)))
    return net, shm


def many_catalogue(counts, with_shm):
    """Many connections (issue 15): aggregate 4 KiB WRITE bandwidth over N connected QPs (16 outstanding
    per QP from and into one 4 KiB buffer a QP, so the data touched stays small however many QPs) and the
    8 B READ round trip taking the next of N QPs each time; the 1-QP rows of the same run are the
    reference. Raw TCP's 8 B ping-pong over as many connections (each round trip on the next, the
    server answering through epoll) is what a cold connection costs the kernel."""
    cat = []
    for n in counts:
        cat.append(("many", f"tcp-q{n}", "pingpong lat", 8,
                    lambda c, n=n: m_tcp(c, "pingpong", 8, "busy", conns=n)))
    for prov in ("soft", "shm") if with_shm else ("soft",):
        for n in counts:
            cat.append(("many", f"{prov}-q{n}", "write bw", 4 * KIB,
                        lambda c, p=prov, n=n: m_conveyor(c, p, "write", "bw", 4 * KIB, qps=n, depth=16)))
            cat.append(("many", f"{prov}-q{n}", "read lat", 8,
                        lambda c, p=prov, n=n: m_conveyor(c, p, "read", "lat", 8, qps=n)))
    return cat


def value_of(metric, r):
    if metric.endswith("bw"):
        return r.get("mb_per_s")
    if metric.endswith("lat"):
        return lat_rtt(r)
    return r.get("mops")
