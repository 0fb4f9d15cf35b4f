// page.js — draws the charts of `dtrain report`'s page as inline SVG from
// the JSON embedded in the page (#report-data). No library, no network.
// Every chart element gets data-rendered="1" (or "empty" when the run has
// no such data) and data-marks (the number of marks drawn) once drawn, so
// a test can check each chart through the DOM.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var DATA = JSON.parse(document.getElementById("report-data").textContent);
  var RUNS = DATA.runs;
  var PALETTE = ["#2f5fd0", "#d0632f", "#2a9d6f", "#8e44ad", "#c0392b", "#16a0b5", "#b58900"];
  var CAT = { compute: "#4b7bec", comm: "#e8833a", wait: "#d64541", data: "#20bf6b", optim: "#8854d0",
              cast: "#a5b1c2", compress: "#f7b731", ckpt: "#4b6584", step: "#dfe4ee" };
  var FIELDS = ["compute", "exposed_comm", "data", "optimizer", "idle"];
  var FIELD_COLOR = { compute: "#4b7bec", exposed_comm: "#e8833a", data: "#20bf6b", optimizer: "#8854d0",
                      idle: "#c8ced9", overlapped_comm: "#f5c28c" };

  var tip = document.createElement("div");
  tip.className = "tip";
  document.body.appendChild(tip);
  function showTip(ev, text) { tip.textContent = text; tip.style.display = "block";
    tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px"; }
  function hideTip() { tip.style.display = "none"; }

  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    var t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function withTip(node, s) {
    node.addEventListener("mousemove", function (ev) { showTip(ev, s); });
    node.addEventListener("mouseleave", hideTip);
    var t = document.createElementNS(NS, "title");
    t.textContent = s;
    node.appendChild(t);
    return node;
  }
  function fmt(v) {
    if (!isFinite(v)) return "–";
    var a = Math.abs(v);
    if (a >= 1e12) return (v / 1e12).toFixed(1) + "T";
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(2).replace(/\.?0+$/, "");
    if (a === 0) return "0";
    return v.toPrecision(2);
  }
  function bytes(v) {
    if (v >= 1 << 30) return (v / (1 << 30)).toFixed(1) + " GiB";
    if (v >= 1 << 20) return (v / (1 << 20)).toFixed(1) + " MiB";
    if (v >= 1 << 10) return (v / (1 << 10)).toFixed(1) + " KiB";
    return v.toFixed(0) + " B";
  }

  // A frame: an SVG of width W, height H with margins; scales x, y.
  function frame(div, opts) {
    // One SVG unit per CSS pixel: the container's width, so text keeps its size.
    var W = Math.max(360, Math.round(div.getBoundingClientRect().width) || opts.width || 560);
    var H = opts.height || 270, m = opts.margin || { l: 58, r: 16, t: 26, b: 40 };
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": opts.label || "" }, div);
    var f = { svg: svg, W: W, H: H, m: m, x0: m.l, x1: W - m.r, y0: H - m.b, y1: m.t, marks: 0 };
    return f;
  }
  function scale(lo, hi, a, b, log) {
    if (log) { lo = Math.log10(lo); hi = Math.log10(hi); }
    if (hi === lo) { hi = lo + 1; }
    var f = function (v) { var u = log ? Math.log10(v) : v; return a + (u - lo) / (hi - lo) * (b - a); };
    f.lo = lo; f.hi = hi; f.log = log;
    return f;
  }
  function ticks(lo, hi, log, n) {
    var out = [];
    if (!(hi > lo)) return out;
    if (log) {
      for (var e = Math.floor(lo); e <= Math.ceil(hi); e++) { var v = Math.pow(10, e); if (e >= lo - 1e-9 && e <= hi + 1e-9) out.push(v); }
      return out;
    }
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / (n || 5))));
    if (!(step > 0)) return out;
    [1, 2, 5, 10].some(function (k) { if (span / (step * k) <= (n || 5)) { step *= k; return true; } return false; });
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
    return out;
  }
  function axes(f, sx, sy, xl, yl, xfmt, yfmt) {
    var g = el("g", { "class": "axis" }, f.svg), grid = el("g", { "class": "grid" }, f.svg);
    el("line", { x1: f.x0, x2: f.x1, y1: f.y0, y2: f.y0 }, g);
    el("line", { x1: f.x0, x2: f.x0, y1: f.y0, y2: f.y1 }, g);
    ticks(sx.lo, sx.hi, sx.log, 6).filter(function (v) { return xl !== "step" || v === Math.round(v); }).forEach(function (v) {
      var x = sx(v);
      el("line", { x1: x, x2: x, y1: f.y0, y2: f.y1 }, grid);
      text(g, x, f.y0 + 14, (xfmt || fmt)(v), { "text-anchor": "middle" });
    });
    ticks(sy.lo, sy.hi, sy.log, 5).forEach(function (v) {
      var y = sy(v);
      el("line", { x1: f.x0, x2: f.x1, y1: y, y2: y }, grid);
      text(g, f.x0 - 6, y + 4, (yfmt || fmt)(v), { "text-anchor": "end" });
    });
    if (xl) text(g, (f.x0 + f.x1) / 2, f.H - 6, xl, { "text-anchor": "middle", "class": "lbl" });
    if (yl) text(g, 12, (f.y0 + f.y1) / 2, yl, { "text-anchor": "middle", "class": "lbl",
                                                 transform: "rotate(-90 12 " + (f.y0 + f.y1) / 2 + ")" });
  }
  function legend(f, items) {
    var x = f.x0, y = 12;
    items.forEach(function (it) {
      el("rect", { x: x, y: y - 8, width: 10, height: 10, fill: it.color }, f.svg);
      var t = text(f.svg, x + 14, y + 1, it.name, { "class": "lbl" });
      x += 24 + 6.5 * it.name.length;
      return t;
    });
  }
  function done(div, f) {
    div.setAttribute("data-rendered", f && f.marks > 0 ? "1" : "empty");
    div.setAttribute("data-marks", f ? f.marks : 0);
  }
  function empty(div, why) {
    var p = document.createElement("div");
    p.className = "empty";
    p.textContent = why;
    div.appendChild(p);
    div.setAttribute("data-rendered", "empty");
    div.setAttribute("data-marks", 0);
  }
  function extent(vals, log) {
    var lo = Infinity, hi = -Infinity;
    vals.forEach(function (v) { if (isFinite(v) && (!log || v > 0)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    if (!isFinite(lo)) return null;
    if (log) { return [Math.pow(10, Math.floor(Math.log10(lo))), Math.pow(10, Math.ceil(Math.log10(hi)))]; }
    if (lo === hi) { lo -= Math.abs(lo) * 0.1 + 1e-9; hi += Math.abs(hi) * 0.1 + 1e-9; }
    return [lo, hi];
  }

  // Lines over steps: series [{name, color, points: [[x, y]], dots}].
  function lineChart(div, series, xl, yl, yfmt) {
    var xs = [], ys = [];
    series.forEach(function (s) { s.points.forEach(function (p) { if (isFinite(p[1])) { xs.push(p[0]); ys.push(p[1]); } }); });
    var ex = extent(xs), ey = extent(ys);
    if (!ex || !ey) return empty(div, "no data");
    if (ey[0] > 0 && ey[0] < ey[1] * 0.5) ey[0] = 0;
    var f = frame(div, { label: yl });
    var sx = scale(ex[0], ex[1], f.x0, f.x1), sy = scale(ey[0], ey[1], f.y0, f.y1);
    axes(f, sx, sy, xl, yl, null, yfmt);
    series.forEach(function (s) {
      var pts = s.points.filter(function (p) { return isFinite(p[1]); });
      if (!pts.length) return;
      if (s.dots) {
        pts.forEach(function (p) {
          withTip(el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3.5, fill: s.color }, f.svg),
                  s.name + ", step " + p[0] + ": " + fmt(p[1]));
          f.marks++;
        });
      } else {
        var d = pts.map(function (p, i) { return (i ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join("");
        withTip(el("path", { d: d, fill: "none", stroke: s.color, "stroke-width": 1.6,
                             "stroke-dasharray": s.dashed ? "5,3" : null }, f.svg),
                s.name + ": last " + fmt(pts[pts.length - 1][1]));
        f.marks++;
      }
    });
    legend(f, series.map(function (s) { return { name: s.name, color: s.color }; }));
    done(div, f);
  }

  function drawLoss(div) {
    var series = [];
    RUNS.forEach(function (r, i) {
      var c = PALETTE[i * 2 % PALETTE.length], lab = RUNS.length > 1 ? r.name + " " : "";
      series.push({ name: lab + "train loss", color: c, points: r.steps.map(function (s) { return [s[0], s[1]]; }) });
      series.push({ name: lab + "val loss", color: PALETTE[(i * 2 + 1) % PALETTE.length], dots: true,
                    points: r.steps.filter(function (s) { return s[2] !== null; }).map(function (s) { return [s[0], s[2]]; }) });
    });
    lineChart(div, series, "step", "loss");
  }
  function drawThroughput(div) {
    lineChart(div, RUNS.map(function (r, i) {
      return { name: (RUNS.length > 1 ? r.name + " " : "") + "tokens/s", color: PALETTE[i % PALETTE.length],
               points: r.steps.slice(r.steps.length > 1 ? 1 : 0).map(function (s) { return [s[0], s[3]]; }) };
    }), "step", "tokens/s (all ranks)");
  }
  function drawMfu(div) {
    lineChart(div, RUNS.map(function (r, i) {
      return { name: (RUNS.length > 1 ? r.name + " " : "") + "MFU", color: PALETTE[(i + 2) % PALETTE.length],
               points: r.steps.slice(r.steps.length > 1 ? 1 : 0).map(function (s) { return [s[0], s[4] === null ? NaN : 100 * s[4]]; }) };
    }), "step", "MFU (%)");
  }

  // Stacked horizontal bars: rows [{label, parts: {field: ms}}].
  function stackedRows(div, rows, title) {
    if (!rows.length) return empty(div, "no step breakdown in this run");
    var H = 40 + rows.length * 24 + 30;
    var f = frame(div, { height: H, margin: { l: 120, r: 20, t: 26, b: 34 }, label: title });
    var max = 0;
    rows.forEach(function (r) { var s = 0; FIELDS.forEach(function (k) { s += r.parts[k] || 0; }); max = Math.max(max, s); });
    if (!(max > 0)) return empty(div, "no step breakdown in this run");
    var sx = scale(0, max, f.x0, f.x1), sy = scale(0, 1, f.y0, f.y1);
    axes(f, sx, { lo: 0, hi: 0, log: false }, "ms per step", null);
    rows.forEach(function (r, i) {
      var y = f.y1 + 10 + i * 24, x = 0;
      text(f.svg, f.x0 - 6, y + 13, r.label, { "text-anchor": "end", "class": "lbl" });
      FIELDS.forEach(function (k) {
        var v = r.parts[k] || 0;
        if (v <= 0) return;
        withTip(el("rect", { x: sx(x), y: y, width: Math.max(0.5, sx(x + v) - sx(x)), height: 18, fill: FIELD_COLOR[k] }, f.svg),
                r.label + ": " + k.replace("_", " ") + " " + v.toFixed(2) + " ms (" + (100 * v / r.parts.step).toFixed(1) + "%)" +
                (k === "compute" && r.parts.overlapped_comm > 0 ? "\noverlapped comm " + r.parts.overlapped_comm.toFixed(2) + " ms" : ""));
        f.marks++;
        x += v;
      });
    });
    void sy;
    legend(f, FIELDS.map(function (k) { return { name: k.replace("_", " "), color: FIELD_COLOR[k] }; }));
    done(div, f);
  }
  function drawBreakdown(div) {
    var rows = [];
    RUNS.forEach(function (r) {
      (r.breakdown.ranks || []).forEach(function (v, rank) {
        var parts = {};
        r.breakdown.fields.forEach(function (k, j) { parts[k] = v[j]; });
        rows.push({ label: (RUNS.length > 1 ? r.name.slice(0, 10) + " " : "") + "rank " + rank, parts: parts });
      });
    });
    stackedRows(div, rows, "step breakdown per rank");
  }
  // Per step, one rank at a time (a select chooses the rank).
  function drawBreakdownSteps(div) {
    var r = RUNS[0], bs = r.breakdown_steps;
    if (!bs || !bs.steps.length) return empty(div, "no per-step breakdown in this run");
    var ctl = document.createElement("div");
    ctl.className = "controls";
    ctl.textContent = "rank ";
    var sel = document.createElement("select");
    for (var i = 0; i < bs.ranks; i++) { var o = document.createElement("option"); o.value = i; o.textContent = i; sel.appendChild(o); }
    ctl.appendChild(sel);
    div.appendChild(ctl);
    var holder = document.createElement("div");
    div.appendChild(holder);
    function draw(rank) {
      holder.innerHTML = "";
      var n = bs.steps.length, nf = r.breakdown.fields.length, max = 0;
      bs.data.forEach(function (row) { max = Math.max(max, row[rank * nf + nf - 1] || 0); });
      var f = frame(holder, { label: "breakdown per step" });
      var sx = scale(bs.steps[0] - 0.5, bs.steps[n - 1] + 0.5, f.x0, f.x1), sy = scale(0, max || 1, f.y0, f.y1);
      axes(f, sx, sy, "step", "ms");
      var w = Math.max(1, (f.x1 - f.x0) / n * 0.8);
      bs.data.forEach(function (row, j) {
        var y = 0;
        FIELDS.forEach(function (k) {
          var v = row[rank * nf + r.breakdown.fields.indexOf(k)] || 0;
          if (v <= 0) return;
          withTip(el("rect", { x: sx(bs.steps[j]) - w / 2, y: sy(y + v), width: w, height: Math.max(0.3, sy(y) - sy(y + v)), fill: FIELD_COLOR[k] }, f.svg),
                  "step " + bs.steps[j] + ", rank " + rank + ": " + k.replace("_", " ") + " " + v.toFixed(2) + " ms");
          f.marks++;
          y += v;
        });
      });
      legend(f, FIELDS.map(function (k) { return { name: k.replace("_", " "), color: FIELD_COLOR[k] }; }));
      done(div, f);
    }
    sel.addEventListener("change", function () { draw(+sel.value); });
    draw(0);
  }

  function drawTimeline(div, r) {
    var tl = r.timeline, pr = tl && tl.predicted;
    if (!tl || (!tl.events.length && !pr)) return empty(div, "no trace (dtrain train --trace)");
    var lanes = [], laneOf = {};
    function addLane(key, t, label) { if (!(key in laneOf)) { laneOf[key] = lanes.length; lanes.push({ key: key, label: label }); } }
    tl.threads.forEach(function (t) { addLane(t[0] + ":" + t[1], t, "rank " + t[0] + " " + t[2]); });
    tl.events.forEach(function (e) { addLane(e[0] + ":" + e[1], e, "rank " + e[0] + " thread " + e[1]); });
    // The predicted step (dtrain plan --timeline-json) starts where the last
    // measured step starts, on lanes of its own below the measured ones.
    var evs = tl.events.map(function (e) { var c = e.slice(); c.key = e[0] + ":" + e[1]; return c; });
    var t0 = tl.t0, t1 = tl.t1, off = tl.t0;
    if (pr) {
      tl.events.forEach(function (e) { if (e[5] === "step" && e[0] === 0) off = Math.max(off, e[2]); });
      pr.threads.forEach(function (t) { addLane("p" + t[0] + ":" + t[1], t, "predicted rank " + t[0] + " " + t[2]); });
      pr.events.forEach(function (e) {
        var c = e.slice(); c[2] = e[2] + off; c.key = "p" + e[0] + ":" + e[1]; c.pred = true;
        addLane(c.key, e, "predicted rank " + e[0] + " thread " + e[1]);
        evs.push(c);
      });
      t1 = Math.max(t1, off + pr.step_us);
    }
    // depth of nesting per lane: longer events first
    evs.sort(function (a, b) { return a[2] - b[2] || b[3] - a[3]; });
    var maxDepth = {}, stacks = {};
    evs.forEach(function (e) {
      var st = stacks[e.key] || (stacks[e.key] = []);
      while (st.length && st[st.length - 1] <= e[2] + 1e-6) st.pop();
      e.d = st.length;
      st.push(e[2] + e[3]);
      maxDepth[e.key] = Math.max(maxDepth[e.key] || 0, st.length);
    });
    var rowH = 9, y = 30, laneY = {};
    lanes.forEach(function (l) { laneY[l.key] = y; y += Math.max(1, maxDepth[l.key] || 1) * rowH + 10; });
    var f = frame(div, { width: 1100, height: y + 64, margin: { l: 190, r: 12, t: 26, b: 36 }, label: "timeline" });
    var sx = scale(0, (t1 - t0) / 1000, f.x0, f.x1);
    axes(f, sx, { lo: 0, hi: 0, log: false }, "ms (" + (tl.steps ? "last " + tl.steps + " traced steps, clocks aligned" : "one step") +
         (pr ? "; predicted: " + (pr.step_us / 1000).toFixed(2) + " ms/step, from the last step's start" : "") + ")", null);
    lanes.forEach(function (l) {
      text(f.svg, f.x0 - 6, laneY[l.key] + 8, l.label, { "text-anchor": "end", "class": l.key[0] === "p" ? "lbl pred" : "lbl" });
    });
    evs.forEach(function (e) {
      var x0 = sx(Math.max(0, (e[2] - t0) / 1000)), x1 = sx(Math.min(t1 - t0, e[2] + e[3] - t0) / 1000);
      var attrs = { x: x0, y: laneY[e.key] + e.d * rowH, width: Math.max(0.4, x1 - x0), height: rowH - 1, fill: CAT[e[5]] || "#999" };
      if (e.pred) { attrs["fill-opacity"] = 0.55; attrs.stroke = "#333"; attrs["stroke-dasharray"] = "2,1"; attrs["class"] = "pred"; }
      var node = el("rect", attrs, f.svg);
      withTip(node, (e.pred ? "predicted: " : "") + e[4] + (e[6] >= 0 ? " [" + e[6] + "]" : "") + " (" + e[5] + ")\n" + (e[3] / 1000).toFixed(3) + " ms" +
              (e[7] > 0 ? ", " + bytes(e[7]) : ""));
      f.marks++;
    });
    legend(f, Object.keys(CAT).filter(function (k) { return evs.some(function (e) { return e[5] === k; }); })
      .map(function (k) { return { name: k, color: CAT[k] }; }));
    done(div, f);
  }

  function drawRoofline(div) {
    var pts = [], peaks = [];
    RUNS.forEach(function (r, i) {
      var rf = r.roofline;
      if (!rf) return;
      rf.kernels.forEach(function (k) {
        if (!(k.us > 0) || !(k.bytes > 0) || !(k.flops > 0)) return;
        pts.push({ run: i, name: k.name, ai: k.flops / k.bytes, perf: k.flops / (k.us * 1e-6), us: k.us, count: k.count,
                   bw: k.bytes / (k.us * 1e-6) });
      });
      peaks.push({ run: i, peak: rf.peak, bw: rf.mem_bw });
    });
    if (!pts.length) return empty(div, "no kernels traced (dtrain train --trace)");
    var ex = extent(pts.map(function (p) { return p.ai; }), true), ey = extent(pts.map(function (p) { return p.perf; }).concat(peaks.map(function (p) { return p.peak; })), true);
    var f = frame(div, { height: 300, label: "roofline" });
    var sx = scale(ex[0], ex[1], f.x0, f.x1, true), sy = scale(ey[0], ey[1], f.y0, f.y1, true);
    axes(f, sx, sy, "arithmetic intensity (FLOP / byte)", "FLOP/s per rank");
    peaks.forEach(function (p, i) {
      if (!(p.peak > 0)) return;
      var c = PALETTE[(p.run + 4) % PALETTE.length], lo = Math.pow(10, sx.lo), hi = Math.pow(10, sx.hi);
      var ridge = p.bw > 0 ? p.peak / p.bw : lo;
      var a = Math.max(lo, Math.min(hi, ridge)), d = "";
      if (p.bw > 0 && ridge > lo) d = "M" + sx(lo) + "," + sy(Math.max(Math.pow(10, sy.lo), lo * p.bw)) + "L" + sx(a) + "," + sy(Math.min(p.peak, a * p.bw));
      d += (d ? "L" : "M" + sx(a) + "," + sy(p.peak)) + sx(hi) + "," + sy(p.peak);
      withTip(el("path", { d: d, fill: "none", stroke: c, "stroke-width": 2, "stroke-dasharray": i ? "6,3" : null }, f.svg),
              (RUNS.length > 1 ? RUNS[p.run].name + ": " : "") + "peak " + fmt(p.peak) + "FLOP/s" + (p.bw > 0 ? ", memory " + fmt(p.bw) + "B/s" : ""));
      f.marks++;
    });
    var total = 0, above = null;
    pts.forEach(function (p) { total += p.us; var pk = peaks.filter(function (q) { return q.run === p.run; })[0];
                               if (pk && pk.peak > 0 && p.perf > 1.1 * pk.peak) above = p; });
    if (above) {
      var n = document.createElement("p");
      n.className = "note";
      n.textContent = above.name + " runs above the measured peak: the cached peak was measured on a busy machine " +
                      "(dtrain bench peak measures it again).";
      div.appendChild(n);
    }
    var placed = [];  // label boxes already drawn: a new one moves down until it is clear
    function place(x, y, w) {
      for (var k = 0; k < 8; k++) {
        var hit = placed.some(function (b) { return x < b[0] + b[2] && b[0] < x + w && Math.abs(y - b[1]) < 11; });
        if (!hit) break;
        y += 11;
      }
      placed.push([x, y, w]);
      return y;
    }
    pts.sort(function (a, b) { return b.us - a.us; });
    pts.forEach(function (p) {
      var rad = 3 + 9 * Math.sqrt(p.us / total);
      withTip(el("circle", { cx: sx(p.ai), cy: sy(p.perf), r: rad.toFixed(1), fill: PALETTE[p.run % PALETTE.length], "fill-opacity": 0.55,
                             stroke: PALETTE[p.run % PALETTE.length] }, f.svg),
              p.name + ": " + fmt(p.perf) + "FLOP/s, " + fmt(p.bw) + "B/s, " + (100 * p.us / total).toFixed(1) + "% of kernel time, " + p.count + " calls");
      if (p.us / total > 0.03) {
        var lx = sx(p.ai) + rad + 2;
        text(f.svg, lx, place(lx, sy(p.perf) + 3, 6 * p.name.length), p.name, { "class": "lbl" });
      }
      f.marks++;
    });
    done(div, f);
  }

  function drawCollectives(div) {
    var pts = [], models = [];
    RUNS.forEach(function (r, i) {
      (r.collectives || []).forEach(function (c) {
        pts.push({ run: i, c: c, x: c.size, y: c.size / (c.us / c.count * 1e-6) });
      });
      (r.links || []).forEach(function (l) { models.push({ run: i, l: l }); });
    });
    if (!pts.length) return empty(div, "no collectives traced");
    var xs = pts.map(function (p) { return p.x; }), ys = pts.map(function (p) { return p.y; });
    models.forEach(function (m) { xs.forEach(function (x) { ys.push(x / (m.l.alpha + x / m.l.beta)); }); });
    var ex = extent(xs, true), ey = extent(ys, true);
    var f = frame(div, { height: 300, label: "collectives" });
    var sx = scale(ex[0], ex[1], f.x0, f.x1, true), sy = scale(ey[0], ey[1], f.y0, f.y1, true);
    axes(f, sx, sy, "message size (bytes)", "algbw (bytes/s)", function (v) { return bytes(v); });
    models.forEach(function (m, i) {
      var d = "", lo = Math.pow(10, sx.lo), hi = Math.pow(10, sx.hi);
      for (var k = 0; k <= 40; k++) {
        var x = lo * Math.pow(hi / lo, k / 40), y = x / (m.l.alpha + x / m.l.beta);
        d += (k ? "L" : "M") + sx(x).toFixed(1) + "," + sy(Math.max(Math.pow(10, sy.lo), Math.min(Math.pow(10, sy.hi), y))).toFixed(1);
      }
      withTip(el("path", { d: d, fill: "none", stroke: PALETTE[(i + 3) % PALETTE.length], "stroke-width": 1.5, "stroke-dasharray": "5,3" }, f.svg),
              "model " + m.l.op + " on " + m.l.transport + " (" + m.l.ranks + " ranks): alpha " + (m.l.alpha * 1e6).toFixed(2) + " us, beta " + fmt(m.l.beta) + "B/s");
      f.marks++;
    });
    pts.forEach(function (p) {
      var c = p.c, mean = c.us / c.count;
      withTip(el("circle", { cx: sx(p.x), cy: sy(p.y), r: 4 + Math.min(6, Math.log10(1 + c.count)), fill: PALETTE[p.run % PALETTE.length], "fill-opacity": 0.6 }, f.svg),
              c.op + " " + bytes(c.size) + " on " + c.link + " (" + c.algo + ", " + c.ranks + " ranks): " + c.count + " calls, mean " +
              mean.toFixed(1) + " us" + (c.model > 0 ? ", model " + c.model.toFixed(1) + " us (" + (100 * c.model / mean).toFixed(0) + "%)" : ", no model (dtrain bench comm)"));
      f.marks++;
    });
    done(div, f);
  }

  function drawMemory(div) {
    var rows = [];
    RUNS.forEach(function (r) {
      var m = r.memory;
      if (!m || !m.peak) return;
      m.peak.forEach(function (p, rank) {
        rows.push({ label: (RUNS.length > 1 ? r.name.slice(0, 10) + " " : "") + "rank " + rank, planned: m.planned, peak: p, base: m.base[rank] });
      });
    });
    if (!rows.length) return empty(div, "no memory figures (summary.json)");
    var H = 40 + rows.length * 30 + 30;
    var f = frame(div, { height: H, margin: { l: 120, r: 20, t: 26, b: 34 }, label: "memory" });
    var max = 0;
    rows.forEach(function (r) { max = Math.max(max, r.peak || 0, r.planned ? r.planned.total + (r.base || 0) : 0); });
    var sx = scale(0, max, f.x0, f.x1);
    axes(f, sx, { lo: 0, hi: 0, log: false }, "bytes per rank", null, bytes);
    var parts = ["params", "grads", "weights16", "optimizer", "activations"], colors = ["#4b7bec", "#e8833a", "#a5b1c2", "#8854d0", "#20bf6b"];
    rows.forEach(function (r, i) {
      var y = f.y1 + 8 + i * 30, x = r.base || 0;
      text(f.svg, f.x0 - 6, y + 12, r.label, { "text-anchor": "end", "class": "lbl" });
      if (x > 0) { withTip(el("rect", { x: sx(0), y: y, width: sx(x) - sx(0), height: 11, fill: "#dfe4ee" }, f.svg), "before the model: " + bytes(x)); f.marks++; }
      if (r.planned) parts.forEach(function (k, j) {
        var v = r.planned[k] || 0;
        if (v <= 0) return;
        withTip(el("rect", { x: sx(x), y: y, width: Math.max(0.5, sx(x + v) - sx(x)), height: 11, fill: colors[j] }, f.svg), "planned " + k + ": " + bytes(v));
        f.marks++;
        x += v;
      });
      if (r.peak > 0) {
        withTip(el("rect", { x: sx(0), y: y + 13, width: sx(r.peak) - sx(0), height: 9, fill: "#1d2433", "fill-opacity": 0.7 }, f.svg), "measured peak resident: " + bytes(r.peak));
        f.marks++;
      }
    });
    legend(f, parts.map(function (k, j) { return { name: k, color: colors[j] }; }).concat([{ name: "measured peak", color: "#1d2433" }]));
    done(div, f);
  }

  var DRAW = { loss: drawLoss, throughput: drawThroughput, mfu: drawMfu, breakdown: drawBreakdown,
               "breakdown-steps": drawBreakdownSteps, roofline: drawRoofline, collectives: drawCollectives,
               memory: drawMemory };
  Array.prototype.forEach.call(document.querySelectorAll(".chart"), function (div) {
    var kind = div.getAttribute("data-chart");
    if (kind === "timeline") drawTimeline(div, RUNS[+div.getAttribute("data-run") || 0]);
    else if (DRAW[kind]) DRAW[kind](div);
    else throw new Error("unknown chart " + kind);
  });
  document.body.setAttribute("data-charts-done", "1");
})();
