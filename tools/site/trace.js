// The course site's trace viewer (tools/site/build.py): draws a Chrome trace
// ("traceEvents", complete "X" spans and "M" names, as common/trace.c writes
// them) inlined in the page as <script id="trace-data">, with no library and
// no network. One row per rank and thread, spans nested in lanes; drag or
// swipe sideways to pan (a vertical swipe or wheel scrolls the page), Ctrl
// and the wheel, the buttons or a pinch where the browser passes it on to
// zoom, tap a span for its name and length.
(function () {
  'use strict';
  // the colours of the committed figures (docs/plots/timeline.py), by the same kinds
  var COLORS = {forward: '#88BBEE', compute: '#3366AA', recompute: '#AA66CC', optimizer: '#228833',
                comm: '#EE7733', wait: '#CC3311', inflight: '#66BB66', step: '#C9C9C9'};
  var LEGEND = {forward: 'forward', compute: 'backward', recompute: 'recompute (forward again)',
                optimizer: 'optimizer', comm: 'comm start/test (host)', wait: 'waiting',
                inflight: 'collective in flight', step: 'step'};
  var LIGHT = {forward: 1, inflight: 1, step: 1};
  function kind(e) {
    if (e.cat !== 'compute') return e.cat;
    if (e.name.indexOf('recompute') >= 0) return 'recompute';
    if (e.name.indexOf('forward') >= 0) return 'forward';
    if (e.name === 'optimizer') return 'optimizer';
    return 'compute';
  }
  var LANE = 16, LABEL = 118, AXIS = 22;
  var data = JSON.parse(document.getElementById('trace-data').textContent);
  var events = data.traceEvents || data;
  var pname = {}, tname = {}, psort = {};
  var rows = {}, spans = [];
  events.forEach(function (e) {
    if (e.ph === 'M') {
      if (e.name === 'process_name') pname[e.pid] = e.args.name;
      if (e.name === 'thread_name') tname[e.pid + ':' + e.tid] = e.args.name;
      if (e.name === 'process_sort_index') psort[e.pid] = e.args.sort_index;
    } else if (e.ph === 'X') {
      spans.push(e);
    }
  });
  spans.forEach(function (e) {
    var k = e.pid + ':' + (e.tid === undefined ? 0 : e.tid);
    (rows[k] = rows[k] || {pid: e.pid, tid: e.tid || 0, spans: []}).spans.push(e);
  });
  var order = Object.keys(rows).map(function (k) { return rows[k]; });
  order.sort(function (a, b) {
    var pa = psort[a.pid] !== undefined ? psort[a.pid] : a.pid, pb = psort[b.pid] !== undefined ? psort[b.pid] : b.pid;
    return pa - pb || a.tid - b.tid;
  });
  var lo = Infinity, hi = -Infinity, y = AXIS;
  order.forEach(function (r) {
    r.spans.sort(function (a, b) { return a.ts - b.ts || b.dur - a.dur; });
    var open = [], lanes = 1;
    r.spans.forEach(function (e) {
      while (open.length && open[open.length - 1] <= e.ts) open.pop();
      e.depth = open.length;
      open.push(e.ts + e.dur);
      lanes = Math.max(lanes, e.depth + 1);
      lo = Math.min(lo, e.ts);
      hi = Math.max(hi, e.ts + e.dur);
    });
    r.y = y;
    r.h = lanes * LANE + 4;
    r.label = (pname[r.pid] || 'pid ' + r.pid) + ' · ' + (tname[r.pid + ':' + r.tid] || 'tid ' + r.tid);
    y += r.h;
  });
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  var height = y + 4;
  var view = {t0: lo, t1: hi};

  var canvas = document.getElementById('trace-canvas');
  var ctx = canvas.getContext('2d');
  var info = document.getElementById('trace-info');
  var width = 0, ratio = 1;

  function fmt(us) {
    var a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(3) + ' s';
    if (a >= 1e3) return (us / 1e3).toFixed(3) + ' ms';
    return us.toFixed(1) + ' us';
  }
  function x(t) { return LABEL + (t - view.t0) / (view.t1 - view.t0) * (width - LABEL); }
  function t(px) { return view.t0 + (px - LABEL) / (width - LABEL) * (view.t1 - view.t0); }

  function resize() {
    ratio = window.devicePixelRatio || 1;
    width = canvas.parentNode.clientWidth - 2;
    canvas.style.height = height + 'px';
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    draw();
  }

  function draw() {
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px sans-serif';
    ctx.textBaseline = 'middle';
    // time axis: about one tick a 90 px
    var span = view.t1 - view.t0, step = Math.pow(10, Math.floor(Math.log10(span / ((width - LABEL) / 90))));
    [1, 2, 5, 10].some(function (m) { if (span / (step * m) <= (width - LABEL) / 90) { step *= m; return true; } });
    ctx.fillStyle = '#555';
    ctx.strokeStyle = '#e4e4e4';
    // ticks at round times from the trace's start (lo), which the labels count from
    for (var tk = lo + Math.ceil((view.t0 - lo) / step) * step; tk <= view.t1; tk += step) {
      var px = x(tk);
      ctx.beginPath(); ctx.moveTo(px, AXIS - 4); ctx.lineTo(px, height); ctx.stroke();
      ctx.fillText(fmt(tk - lo), px + 2, AXIS / 2);
    }
    order.forEach(function (r, k) {
      if (k % 2) { ctx.fillStyle = 'rgba(0,0,0,0.03)'; ctx.fillRect(0, r.y, width, r.h); }
      ctx.save();
      ctx.beginPath(); ctx.rect(LABEL, r.y, width - LABEL, r.h); ctx.clip();
      r.spans.forEach(function (e) {
        if (e.ts > view.t1 || e.ts + e.dur < view.t0) return;
        var x0 = Math.max(x(e.ts), LABEL - 1), x1 = Math.min(x(e.ts + e.dur), width + 1);
        var w = Math.max(x1 - x0, 0.8), yy = r.y + 2 + e.depth * LANE;
        var k = kind(e);
        ctx.fillStyle = COLORS[k] || '#999';
        ctx.fillRect(x0, yy, w, LANE - 2);
        if (w > 40) {
          ctx.fillStyle = LIGHT[k] ? '#222' : '#fff';
          ctx.fillText(e.name, x0 + 3, yy + LANE / 2 - 1, w - 6);
        }
      });
      ctx.restore();
      ctx.fillStyle = '#222';
      ctx.fillText(r.label, 4, r.y + 2 + LANE / 2 - 1, LABEL - 8);
    });
  }

  function zoom(f, at) {
    var c = t(at === undefined ? (LABEL + width) / 2 : at), s = (view.t1 - view.t0) * f;
    s = Math.min(Math.max(s, 1), (hi - lo) * 1.5);
    var r = (c - view.t0) / (view.t1 - view.t0);
    view.t0 = c - r * s; view.t1 = view.t0 + s;
    draw();
  }
  function pan(dpx) {
    var d = dpx / (width - LABEL) * (view.t1 - view.t0);
    view.t0 -= d; view.t1 -= d;
    draw();
  }
  function hit(px, py) {
    var found = null;
    order.forEach(function (r) {
      if (py < r.y || py >= r.y + r.h) return;
      var depth = Math.floor((py - r.y - 2) / LANE), tt = t(px), tol = 3 / (width - LABEL) * (view.t1 - view.t0);
      r.spans.forEach(function (e) {
        if (e.depth === depth && e.ts - tol <= tt && tt <= e.ts + e.dur + tol) found = {e: e, r: r};
      });
    });
    return found;
  }
  function show(h) {
    if (!h) { info.textContent = 'Tap a span.'; return; }
    var e = h.e;
    info.textContent = e.name + '  [' + e.cat + ']  ' + h.r.label + '\nstart ' + fmt(e.ts - lo) +
      ', length ' + fmt(e.dur) + (e.args ? '  ' + JSON.stringify(e.args) : '');
  }

  // pointers: one drags, two pinch; a tap that did not move shows a span
  var pts = {}, moved = false, pinch = null;
  canvas.addEventListener('pointerdown', function (ev) {
    canvas.setPointerCapture(ev.pointerId);
    pts[ev.pointerId] = {x: ev.offsetX, y: ev.offsetY};
    moved = false;
    var ids = Object.keys(pts);
    if (ids.length === 2) pinch = Math.abs(pts[ids[0]].x - pts[ids[1]].x) || 1;
  });
  canvas.addEventListener('pointermove', function (ev) {
    var p = pts[ev.pointerId];
    if (!p) return;
    var ids = Object.keys(pts);
    if (ids.length === 2) {
      p.x = ev.offsetX;
      var d = Math.abs(pts[ids[0]].x - pts[ids[1]].x) || 1;
      zoom(pinch / d, (pts[ids[0]].x + pts[ids[1]].x) / 2);
      pinch = d;
      moved = true;
      return;
    }
    if (Math.abs(ev.offsetX - p.x) > 2) moved = true;
    pan(ev.offsetX - p.x);
    p.x = ev.offsetX;
  });
  function up(ev) {
    if (pts[ev.pointerId] && !moved && Object.keys(pts).length === 1) show(hit(ev.offsetX, ev.offsetY));
    delete pts[ev.pointerId];
    pinch = null;
  }
  canvas.addEventListener('pointerup', up);
  canvas.addEventListener('pointercancel', up);
  // the wheel scrolls the page; with Ctrl (or a pinch, which browsers send
  // as Ctrl + wheel) it zooms, and sideways it pans
  canvas.addEventListener('wheel', function (ev) {
    var sideways = Math.abs(ev.deltaX) > Math.abs(ev.deltaY);
    if (!sideways && !ev.ctrlKey && !ev.metaKey) return;
    ev.preventDefault();
    if (sideways) pan(-ev.deltaX);
    else zoom(Math.exp(ev.deltaY * 0.002), ev.offsetX);
  }, {passive: false});

  document.querySelectorAll('.trace-bar button').forEach(function (b) {
    b.addEventListener('click', function () {
      var z = b.getAttribute('data-z');
      if (z === 'in') zoom(0.5);
      else if (z === 'out') zoom(2);
      else { view.t0 = lo; view.t1 = hi; draw(); }
    });
  });
  var sel = document.getElementById('trace-step');
  var steps = spans.filter(function (e) { return e.cat === 'step' && e.pid === order[0].pid; });
  sel.appendChild(new Option('whole run', ''));
  steps.forEach(function (e, k) { sel.appendChild(new Option(e.name, k)); });
  sel.addEventListener('change', function () {
    if (sel.value === '') { view.t0 = lo; view.t1 = hi; }
    else { var e = steps[+sel.value]; view.t0 = e.ts - e.dur * 0.02; view.t1 = e.ts + e.dur * 1.02; }
    draw();
  });
  var legend = document.getElementById('trace-legend');
  var used = {};
  spans.forEach(function (e) { used[kind(e)] = 1; });
  Object.keys(COLORS).filter(function (c) { return used[c]; }).forEach(function (c) {
    var s = document.createElement('span');
    s.innerHTML = '<i style="background:' + COLORS[c] + '"></i>' + LEGEND[c];
    legend.appendChild(s);
  });
  window.addEventListener('resize', resize);
  // open on the first timed step when there is one: the whole run is mostly start-up
  var first = steps.filter(function (e) { return e.args && e.args.timed; })[0];
  if (first) { view.t0 = first.ts - first.dur * 0.02; view.t1 = first.ts + first.dur * 1.02; sel.value = steps.indexOf(first); }
  resize();
})();
