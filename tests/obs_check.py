#!/usr/bin/env python3
"""obs_check.py — checks of a traced run directory and of a report's DOM.

  obs_check.py trace RUN_DIR [--world N] [--skew RANK:OFFSET_MS:DRIFT_PPM]
      Every trace file (rank-R.json, trace.json) is JSON with the Chrome trace
      fields; complete events nest per thread; in the merged file every
      collective whose result needs every rank's data (allreduce, allgather,
      reduce_scatter, alltoall, barrier) starts on every rank before it ends on
      any (within the clock alignment's error bound, which is 0 for ranks on
      one kernel); metrics.jsonl has every rank's breakdown and summary.json its
      means. With --skew the named rank's clock was skewed (DT_FAULT_CLOCK): the
      alignment must have found the offset and drift within its bounds.

  obs_check.py predicted FILE [--processes N] [--step-s S]
      A predicted timeline (dtrain plan --timeline-json): JSON with the Chrome
      trace fields, every lane's events one after another (a lane runs one
      task at a time), otherData.predicted true, N processes (pipeline
      stages) and, with --step-s, the last event ending at S seconds (0.1%).

  obs_check.py dom DOM_FILE --charts a,b,... [--advice-rule RULE --advice-text TEXT]
      The DOM chromium dumped after the page's scripts ran: no JavaScript
      error, every chart drawn (data-rendered="1", marks > 0, an <svg>), the
      advice list present; optionally one piece of advice of rule RULE whose
      text holds TEXT.

Exits 1 with every failure printed.
"""
import json
import os
import sys
from html.parser import HTMLParser

FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL: " + msg)


def load_trace(path):
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("%s: no traceEvents array" % path)
        return None
    return doc


def check_schema(path, doc):
    n = 0
    for e in doc["traceEvents"]:
        for k, t in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
            if not isinstance(e.get(k), t):
                fail("%s: event without %s (%s): %r" % (path, k, t.__name__, e))
                return
        if e["ph"] == "X":
            n += 1
            for k in ("ts", "dur"):
                if not isinstance(e.get(k), (int, float)) or (k == "dur" and e[k] < 0):
                    fail("%s: complete event with bad %s: %r" % (path, k, e))
                    return
            if not isinstance(e.get("cat"), str) or not isinstance(e.get("args"), dict):
                fail("%s: complete event without cat or args: %r" % (path, e))
                return
        elif e["ph"] != "M":
            fail("%s: unexpected phase %r" % (path, e["ph"]))
    if n == 0:
        fail("%s: no complete events" % path)
    names = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    if used - names:
        fail("%s: threads without a thread_name: %s" % (path, sorted(used - names)))
    return n


def check_nesting(path, doc):
    # ts and dur are printed to 1 ns (0.001 us): allow that rounding.
    eps = 0.0021
    lanes = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    bad = 0
    for lane, evs in lanes.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + eps:
                bad += 1
                if bad <= 3:
                    fail("%s: rank %d thread %d: %s [%.3f, %.3f] overlaps %s [%.3f, %.3f] without nesting"
                         % (path, lane[0], lane[1], e["name"], e["ts"], e["ts"] + e["dur"],
                            stack[-1]["name"], stack[-1]["ts"], stack[-1]["ts"] + stack[-1]["dur"]))
            stack.append(e)
    return bad


ALL_TO_ALL = {"allreduce", "allgather", "reduce_scatter", "alltoall", "barrier"}


def check_order(path, doc, world, tol_us):
    groups = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "comm" and e["name"] in ALL_TO_ALL:
            a = e["args"]
            if a.get("ranks", 0) > 1:
                groups.setdefault((a["group"], a["seq"]), []).append(e)
    checked = late = 0
    worst = -1e30
    for key, evs in groups.items():
        if len(evs) != evs[0]["args"]["ranks"]:
            continue  # a rank's ring wrapped past it, or it fell outside --trace-steps
        checked += 1
        last_start = max(e["ts"] for e in evs)
        first_end = min(e["ts"] + e["dur"] for e in evs)
        worst = max(worst, last_start - first_end)
        if last_start > first_end + tol_us + 0.0021:
            late += 1
            if late <= 3:
                fail("%s: %s seq %d of group %s: the last rank starts at %.3f us, after the first "
                     "end at %.3f us (tolerance %.3f us)" % (path, evs[0]["name"], key[1], key[0],
                                                            last_start, first_end, tol_us))
    if checked < 5:
        fail("%s: only %d collective(s) seen on every rank" % (path, checked))
    print("ok: %d collectives on all ranks, last start - first end at most %.3f us (tolerance %.3f)"
          % (checked, worst, tol_us))


def check_trace(run, world, skew):
    tdir = os.path.join(run, "trace")
    for r in range(world):
        p = os.path.join(tdir, "rank-%d.json" % r)
        doc = load_trace(p)
        if doc:
            check_schema(p, doc)
            check_nesting(p, doc)
            if {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} != {r}:
                fail("%s: events of other ranks" % p)
    p = os.path.join(tdir, "trace.json")
    doc = load_trace(p)
    if not doc:
        return
    n = check_schema(p, doc)
    check_nesting(p, doc)
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    if pids != set(range(world)):
        fail("%s: events of ranks %s, expected 0..%d" % (p, sorted(pids), world - 1))
    cats = {e["cat"] for e in doc["traceEvents"] if e["ph"] == "X"}
    for c in ("step", "compute", "comm", "data", "optim"):
        if c not in cats:
            fail("%s: no %s event" % (p, c))
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    for nm in ("matmul_fwd", "matmul_bwd", "attention_fwd", "block_fwd", "block_bwd", "allreduce",
               "step", "data"):
        if nm not in names:
            fail("%s: no %s event" % (p, nm))
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"] == "matmul_fwd":
            if not (e["args"].get("flops", 0) > 0 and e["args"].get("bytes", 0) > 0):
                fail("%s: matmul_fwd without flops and bytes: %r" % (p, e))
            break
    clocks = doc.get("otherData", {}).get("clocks", [])
    if len(clocks) != world:
        fail("%s: %d clock records for %d ranks" % (p, len(clocks), world))
        return
    tol = 0.0
    for c in clocks:
        if c["dropped"]:
            fail("%s: rank %d's ring dropped %d events" % (p, c["rank"], c["dropped"]))
        if c["method"] == "store":
            tol = max(tol, c["error_ns"] * 1e-3)
    if skew:
        rank, off_ms, ppm = skew
        c = clocks[rank]
        if c["method"] != "store":
            fail("rank %d skewed by %g ms but aligned as %r" % (rank, off_ms, c["method"]))
        want = -off_ms * 1e6
        err = max(c["start"]["error_ns"], c["end"]["error_ns"])
        if abs(c["offset_ns"] - want) > err + 2000:
            fail("rank %d: offset %.0f ns, expected %.0f +- %.0f" % (rank, c["offset_ns"], want, err))
        bound = (c["start"]["error_ns"] + c["end"]["error_ns"]) / max(c["span_ns"], 1) * 1e6
        if abs(c["drift_ppm"] + ppm) > bound + 1:
            fail("rank %d: drift %.2f ppm, expected %.2f +- %.2f" % (rank, c["drift_ppm"], -ppm, bound))
        print("ok: rank %d offset %.0f ns (injected %.0f), drift %.2f ppm (injected %.2f, bound %.2f)"
              % (rank, c["offset_ns"], want, c["drift_ppm"], -ppm, bound))
    else:
        for c in clocks[1:]:
            if c["method"] != "same kernel":
                fail("rank %d on this kernel aligned as %r" % (c["rank"], c["method"]))
    check_order(p, doc, world, tol)
    print("ok: %s: %d complete events" % (p, n))
    # The step breakdown.
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    full = [l for l in lines if len(l.get("breakdown", {}).get("compute", [])) == world]
    if len(full) != len(lines):
        fail("metrics.jsonl: %d of %d lines have every rank's breakdown" % (len(full), len(lines)))
    for l in full:
        b = l["breakdown"]
        for r in range(world):
            parts = sum(b[k][r] for k in ("compute", "exposed_comm", "data", "optimizer", "idle"))
            if abs(parts - b["step"][r]) > 0.01 + 1e-3 * b["step"][r]:
                fail("step %d rank %d: parts add to %.3f ms, the step is %.3f" % (l["step"], r, parts, b["step"][r]))
            if min(b[k][r] for k in b) < 0:
                fail("step %d rank %d: a negative part: %r" % (l["step"], r, b))
    summ = json.load(open(os.path.join(run, "summary.json")))
    if len(summ["breakdown"]["compute"]) != world or summ["breakdown"]["steps"] < 1:
        fail("summary.json: breakdown of %r" % summ["breakdown"])
    if len(summ["memory"]["peak_resident"]) != world:
        fail("summary.json: memory of %r" % summ["memory"])


class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts = {}
        self.stack = []
        self.errors = None
        self.in_errors = False
        self.advice = []  # (rule, text)
        self.cur_rule = None
        self.done = False
        self.svgs = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-charts-done") == "1":
            self.done = True
        if a.get("class") == "chart":
            self.charts[a.get("id")] = a
            self.stack.append(a.get("id"))
        elif self.stack and tag == "svg":
            self.svgs[self.stack[-1]] = True
        if a.get("id") == "js-errors":
            self.in_errors = True
            self.errors = ""
        if tag == "li" and "data-rule" in a:
            self.cur_rule = a["data-rule"]
            self.advice.append([self.cur_rule, ""])

    def handle_endtag(self, tag):
        if tag == "div" and self.in_errors:
            self.in_errors = False
        if tag == "li":
            self.cur_rule = None

    def handle_data(self, data):
        if self.in_errors:
            self.errors += data
        if self.cur_rule is not None:
            self.advice[-1][1] += data


def check_dom(path, charts, rule, text):
    d = Dom()
    d.feed(open(path, encoding="utf-8").read())
    if d.errors is None:
        fail("%s: no #js-errors element" % path)
    elif d.errors.strip():
        fail("%s: JavaScript errors: %s" % (path, d.errors.strip()))
    if not d.done:
        fail("%s: the charts' script did not finish" % path)
    for c in charts:
        a = d.charts.get("chart-" + c)
        if not a:
            fail("%s: no chart %s" % (path, c))
        elif a.get("data-rendered") != "1" or int(a.get("data-marks", "0")) <= 0:
            fail("%s: chart %s not drawn (rendered %r, marks %r)" % (path, c, a.get("data-rendered"), a.get("data-marks")))
        elif not d.svgs.get("chart-" + c):
            fail("%s: chart %s has no svg" % (path, c))
        else:
            print("ok: chart %s: %s marks" % (c, a["data-marks"]))
    if not d.advice:
        fail("%s: no advice" % path)
    for r, t in d.advice:
        print("advice [%s]: %s" % (r, " ".join(t.split())[:160]))
    if rule:
        hits = [t for r, t in d.advice if r == rule and text in t]
        if not hits:
            fail("%s: no %s advice mentioning %r" % (path, rule, text))


def check_predicted(path, processes, step_s):
    doc = load_trace(path)
    if doc is None:
        return
    n = check_schema(path, doc)
    check_nesting(path, doc)
    if not (doc.get("otherData") or {}).get("predicted") is True:
        fail("%s: otherData.predicted is not true" % path)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    pids = {e["pid"] for e in xs}
    if processes is not None and len(pids) != processes:
        fail("%s: %d processes %s, expected %d" % (path, len(pids), sorted(pids), processes))
    end = max((e["ts"] + e["dur"] for e in xs), default=0) * 1e-6
    if step_s is not None and abs(end - step_s) > 1e-3 * step_s + 1e-6:
        fail("%s: the last event ends at %.6g s, the simulated step is %.6g s" % (path, end, step_s))
    print("predicted timeline: %d events, %d processes, %.6g s" % (n, len(pids), end))


def main():
    a = sys.argv[1:]
    if len(a) >= 2 and a[0] == "trace":
        world, skew = 1, None
        i = 2
        while i < len(a):
            if a[i] == "--world":
                world = int(a[i + 1])
            elif a[i] == "--skew":
                r, o, p = a[i + 1].split(":")
                skew = (int(r), float(o), float(p))
            i += 2
        check_trace(a[1], world, skew)
    elif len(a) >= 2 and a[0] == "predicted":
        processes, step_s = None, None
        i = 2
        while i < len(a):
            if a[i] == "--processes":
                processes = int(a[i + 1])
            elif a[i] == "--step-s":
                step_s = float(a[i + 1])
            i += 2
        check_predicted(a[1], processes, step_s)
    elif len(a) >= 2 and a[0] == "dom":
        charts, rule, text = [], None, None
        i = 2
        while i < len(a):
            if a[i] == "--charts":
                charts = a[i + 1].split(",")
            elif a[i] == "--advice-rule":
                rule = a[i + 1]
            elif a[i] == "--advice-text":
                text = a[i + 1]
            i += 2
        check_dom(a[1], charts, rule, text)
    else:
        print(__doc__)
        return 2
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
