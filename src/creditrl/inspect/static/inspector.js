// creditrl credit inspector: renders the inlined data; vanilla JS, no network.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("inspector-data").textContent);
  // group -1: none shown (the reward-spread filter hides every group of the iteration)
  const S = { it: D.initial, group: 0, resp: 0, est: "trained", cmp: "", only: !!D.only_spread };
  const NEG = [33, 102, 172], POS = [178, 24, 43];
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const fmt = (x) => (x === null || x === undefined ? "-" : Number(x).toFixed(3));
  // the scale's end: 0.250, 3.2e-5, 0 (scale_label in creditrl.inspect.scale)
  const fmtScale = (x) => (x === 0 ? "0" : Math.abs(x) >= 1e-3 ? x.toFixed(3) : Number(x.toPrecision(2)).toExponential());
  const cur = () => D.iterations[S.it];
  const group = () => cur().groups[S.group];
  // indices of the groups shown: all, or with the filter on only those with reward spread
  const visible = () => cur().groups.map((g, i) => i).filter((i) => !S.only || cur().groups[i].spread);
  const nResp = () => (S.group < 0 ? 1 : group().responses.length);

  // Diverging scale, symmetric around 0: blue < 0, white at 0, red > 0, full at |a| = max;
  // |a| under the floor (float rounding of a group without spread) is 0 (creditrl.inspect.scale)
  const FLOOR = D.floor || 0;
  function colour(a, max) {
    const t = max > 0 && Math.abs(a) >= FLOOR ? Math.min(1, Math.abs(a) / max) : 0;
    const c = a < 0 ? NEG : POS;
    const mix = c.map((v) => Math.round(255 + (v - 255) * t));
    return { bg: "rgb(" + mix.join(", ") + ")", dark: t > 0.6 };
  }

  function shownKeys() {
    return [S.est].concat(S.cmp ? [S.cmp] : []);
  }

  function maxAbs() {
    let m = 0;
    for (const key of shownKeys()) {
      const e = cur().estimators[key];
      if (!e || !e.available) continue;
      for (const row of e.adv[S.group]) for (const a of row) m = Math.max(m, Math.abs(a));
    }
    return m >= FLOOR ? m : 0;
  }

  function options(select, items, value) {
    select.replaceChildren(...items.map(([v, label, attrs]) => {
      const o = el("option", Object.assign({ value: v }, attrs), label);
      if (String(v) === String(value)) o.selected = true;
      return o;
    }));
  }

  function renderControls() {
    const it = cur();
    options($("iteration-select"), D.iterations.map((x, i) => [i, String(x.iteration)]), S.it);
    const groups = visible().map((i) => {
      const g = it.groups[i];
      return [i, "group " + g.group_id + ": " + g.prompt + (g.spread ? "" : " (no reward spread)"),
        { "data-spread": g.spread ? "1" : "0" }];
    });
    options($("group-select"), groups.length ? groups : [[-1, "(no group with reward spread)"]], S.group);
    renderSpreadCount(it);
    options($("estimator-select"), it.order.map((k) => [k, it.estimators[k].label]), S.est);
    options($("compare-select"), [["", "(none)"]].concat(it.order.map((k) => [k, it.estimators[k].label])), S.cmp);
    const s = it.settings;
    $("settings").textContent = "iteration " + it.iteration + " | estimator " + s.estimator + ", normaliser " +
      s.normaliser + ", resolution " + s.resolution + ", gamma " + s.gamma + ", lambda " + fmt(s.lam) +
      " | reward " + s.reward_source + (s.granularity ? "/" + s.granularity : "") + ", values " + s.value_source +
      " | " + it.groups.length + " of " + it.groups_in_batch + " groups saved";
  }

  function renderSpreadCount(it) {
    $("spread-filter").checked = S.only;
    if (!it.spread) return;
    const all = D.spread && D.iterations.length > 1 ? " (" + D.spread.none + " of " + D.spread.groups + " over all " +
      D.iterations.length + " iterations)" : "";
    const c = $("spread-count");
    c.textContent = it.spread.text + all;
    c.setAttribute("data-none", String(it.spread.none));
    c.setAttribute("data-groups", String(it.spread.groups));
  }

  function renderLegend(max) {
    const L = $("legend");
    L.replaceChildren(
      el("span", {}, "advantage"), el("span", {}, max ? "-" + fmtScale(max) : "0"), el("span", { class: "bar" }),
      el("span", {}, max ? "+" + fmtScale(max) : "0"),
      el("span", { id: "legend-max", "data-value": String(max) },
        max ? "max |A| = " + fmtScale(max) : "every |A| under " + FLOOR.toExponential() + ": shown as 0"),
      el("span", { class: "key" }, "▁ reward placed"), el("span", { class: "key" }, "▏ step end"),
      el("span", { class: "key" }, "✓/✗ oracle step label"));
  }

  function tokenSpan(r, i, a, max, ends, placed) {
    const text = r.special[i] !== undefined ? r.special[i] : r.texts[i];
    const span = el("span", { class: "tok", "data-adv": String(a), "data-index": String(i) }, text);
    const c = colour(a, max);
    span.style.backgroundColor = c.bg;
    if (c.dark) span.style.color = "#fff";
    if (r.special[i] !== undefined) span.classList.add("special");
    if (r.masked.includes(i)) span.classList.add("masked");
    if (ends.has(i)) span.classList.add("step-end");
    if (placed.has(i)) { span.classList.add("placed"); span.setAttribute("data-reward", String(r.rewards[i])); }
    let title = "A = " + a + "\nreward = " + r.rewards[i] + (placed.has(i) ? " (placed)" : "");
    if (r.values) title += "\nV = " + r.values[i];
    span.title = title;
    return span;
  }

  function responseBlock(r, ri, adv, prec, max) {
    const cls = "response" + (ri === S.resp ? " selected" : "") + (r.kept ? "" : " dropped");
    const box = el("div", { class: cls, "data-response": String(ri), "data-outcome": String(r.outcome) });
    const right = r.outcome > 0.5;
    const head = el("div", { class: "head" });
    const total = r.rewards.reduce((s, x) => s + x, 0);
    head.append(el("span", { class: "outcome " + (right ? "right" : "wrong") }, right ? "✓" : "✗"),
      " #" + ri + " outcome " + r.outcome + " | R = " + fmt(total) + " | " + r.texts.length + " tokens" +
      " | credit precision " + prec.text + (r.kept ? "" : " | dropped (no credit)") + (r.finished ? "" : " | truncated"));
    const toks = el("div", { class: "tokens" });
    const ends = new Set(r.step_ends), placed = new Set(r.reward_mask);
    r.steps.forEach(([s, e], k) => {
      for (let i = s; i <= e; i++) toks.append(tokenSpan(r, i, adv[i], max, ends, placed));
      if (r.labels) {
        const ok = r.labels[k];
        toks.append(el("span", { class: "step-label " + (ok ? "ok" : "bad"), "data-label": ok ? "1" : "0" }, ok ? "✓" : "✗"));
      }
    });
    box.append(head, toks);
    box.addEventListener("click", (ev) => {
      S.resp = ri;
      const t = ev.target.closest(".tok");
      render();
      if (t) showToken(ri, Number(t.getAttribute("data-index")));
    });
    return box;
  }

  function column(key, side, max) {
    const e = cur().estimators[key];
    const suffix = side === "left" ? "" : "-right";
    const col = el("section", { class: "column", id: "column-" + side, "data-estimator": key });
    col.append(el("h2", {}, e.label));
    if (!e.available) {
      col.append(el("div", { class: "unavailable", id: "unavailable" + suffix }, "unavailable: " + e.reason));
      return col;
    }
    if (e.note) col.append(el("div", { class: "note" }, e.note));
    const p = e.precision, pg = p.groups[S.group];
    if (pg.note) col.append(el("div", { class: "note", id: "credit-note" + suffix }, pg.note));
    const meta = el("div", { class: "meta" });
    meta.append("credit precision: this group ",
      el("b", { id: "credit-precision" + suffix, "data-value": String(pg.value) }, pg.text),
      ...(pg.why ? [" ", el("span", { class: "why", id: "credit-why" + suffix }, "(" + pg.why + ")")] : []),
      ", all saved groups ",
      el("b", { id: "credit-precision-all" + suffix, "data-value": String(p.all.value) }, p.all.text));
    col.append(meta);
    group().responses.forEach((r, ri) => col.append(responseBlock(r, ri, e.adv[S.group][ri], p.responses[S.group][ri], max)));
    return col;
  }

  function showToken(ri, i) {
    const r = group().responses[ri];
    const parts = ["response #" + ri + ", token " + i + " " + JSON.stringify(r.special[i] || r.texts[i])];
    for (const key of shownKeys()) {
      const e = cur().estimators[key];
      if (e.available) parts.push(e.label + ": A = " + e.adv[S.group][ri][i]);
    }
    parts.push("reward " + r.rewards[i] + (r.reward_mask.includes(i) ? " (placed)" : "") + (r.values ? ", V = " + r.values[i] : ""));
    $("detail").textContent = parts.join("\n");
    document.querySelectorAll("#columns .response.selected .tok").forEach((t) =>
      t.classList.toggle("focus", Number(t.getAttribute("data-index")) === i));
  }

  // Credit precision of every estimator on this group and on all saved groups of the iteration.
  function renderPrecisionTable() {
    const it = cur(), row = $("precision-table");
    row.replaceChildren(el("span", { class: "label" }, "credit precision (group / all saved):"));
    for (const key of it.order) {
      const e = it.estimators[key];
      const pg = e.available ? e.precision.groups[S.group] : null;
      const text = pg ? pg.text + (pg.short ? " (" + pg.short + ")" : "") + " / " + e.precision.all.text : "unavailable";
      row.append(el("span", { class: "cell", "data-estimator": key }, e.label + " " + text));
    }
  }

  function renderColumns() {
    if (S.group < 0) {
      $("prompt").replaceChildren(el("span", { class: "no-spread", id: "spread-note" }, "no saved group of iteration " +
        cur().iteration + " has reward spread; untick \u201conly groups with reward spread\u201d to see them all"));
      for (const id of ["legend", "precision-table", "columns", "detail"]) $(id).replaceChildren();
      return;
    }
    const g = group(), max = maxAbs();
    const right = g.responses.filter((r) => r.outcome > 0.5).length;
    $("prompt").replaceChildren(el("span", {}, g.prompt),
      el("span", { class: "answer" }, "answer " + g.answer + " | " + right + " of " + g.responses.length + " right"),
      ...(g.spread_note ? [el("span", { class: "no-spread", id: "spread-note" }, g.spread_note)] : []));
    renderLegend(max);
    renderPrecisionTable();
    const cols = $("columns");
    cols.className = S.cmp ? "compare" : "";
    cols.replaceChildren(column(S.est, "left", max), ...(S.cmp ? [column(S.cmp, "right", max)] : []));
    const r = g.responses[S.resp];
    $("detail").textContent = "response #" + S.resp + ": " + JSON.stringify(r.completion) +
      " (click a token for its numbers)";
  }

  function chart(spec) {
    const box = el("div", { class: "chart", "data-chart": spec.title });
    box.append(el("div", { class: "title" }, spec.title));
    const pts = spec.series.map((s) => D.metrics.filter((m) => typeof m[s.key] === "number").map((m) => [m.iteration, m[s.key]]));
    const all = pts.flat();
    if (!all.length) { box.append(el("div", { class: "empty" }, spec.empty)); return box; }
    const W = 290, H = 96, P = 24, ns = "http://www.w3.org/2000/svg";
    const xs = all.map((p) => p[0]).concat(D.iterations.map((x) => x.iteration)), ys = all.map((p) => p[1]);
    let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const X = (x) => P + (x - x0) / (x1 - x0) * (W - P - 6), Y = (y) => H - 14 - (y - y0) / (y1 - y0) * (H - 22);
    const svg = document.createElementNS(ns, "svg");
    const add = (tag, attrs, text) => {
      const n = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
      if (text !== undefined) n.textContent = text;
      svg.append(n);
      return n;
    };
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    add("text", { x: 0, y: 10, "font-size": 9, fill: "#777" }, String(+y1.toPrecision(3)));
    add("text", { x: 0, y: H - 14, "font-size": 9, fill: "#777" }, String(+y0.toPrecision(3)));
    add("text", { x: P, y: H - 2, "font-size": 9, fill: "#777" }, "iteration " + x0);
    add("text", { x: W - 6, y: H - 2, "font-size": 9, fill: "#777", "text-anchor": "end" }, String(x1));
    const colours = ["#1f5fa8", "#d9730d"];
    pts.forEach((p, k) => {
      if (!p.length) return;
      const points = p.map(([x, y]) => X(x) + "," + Y(y)).join(" ");
      add("polyline", { points: points, fill: "none", stroke: colours[k], "stroke-width": 1.5 });
      if (p.length < 40) p.forEach(([x, y]) => add("circle", { cx: X(x), cy: Y(y), r: 1.8, fill: colours[k] }));
    });
    const x = X(cur().iteration);
    add("line", { x1: x, x2: x, y1: 4, y2: H - 14, stroke: "#b42318", "stroke-dasharray": "3,2", class: "cursor" });
    if (spec.series.length > 1) {
      spec.series.forEach((s, k) =>
        add("text", { x: W - 6, y: 10 + 10 * k, "font-size": 9, fill: colours[k], "text-anchor": "end" }, s.label));
    }
    svg.addEventListener("click", (ev) => {
      const r = svg.getBoundingClientRect(), at = x0 + (ev.clientX - r.left - P) / (W - P - 6) * (x1 - x0);
      let best = 0;
      D.iterations.forEach((it, i) => {
        if (Math.abs(it.iteration - at) < Math.abs(D.iterations[best].iteration - at)) best = i;
      });
      setIteration(best);
    });
    box.append(svg);
    return box;
  }

  function render() {
    renderControls();
    renderColumns();
    $("charts").replaceChildren(...D.charts.map(chart));
  }

  // keep the selected group one that is shown (the first shown when it is hidden), or -1
  function fixGroup() {
    const v = visible();
    S.group = Math.max(0, Math.min(S.group, cur().groups.length - 1));
    if (!v.includes(S.group)) S.group = v.length ? v[0] : -1;
    S.resp = Math.max(0, Math.min(S.resp, nResp() - 1));
  }
  function setIteration(i) {
    S.it = Math.max(0, Math.min(D.iterations.length - 1, i));
    fixGroup();
    if (!cur().estimators[S.est]) S.est = "trained";
    if (S.cmp && !cur().estimators[S.cmp]) S.cmp = "";
    render();
  }
  function setGroup(i) {
    if (i < 0) return;
    S.group = i;
    fixGroup();
    render();
  }
  function stepGroup(step) {  // the previous / next shown group, cyclically
    const v = visible();
    if (v.length) setGroup(v[(v.indexOf(S.group) + step + v.length) % v.length]);
  }
  function setFilter(only) {
    S.only = only;
    fixGroup();
    render();
  }
  function cycle(list, value, step) {
    return list[(list.indexOf(value) + step + list.length) % list.length];
  }

  $("iteration-select").addEventListener("change", (ev) => setIteration(Number(ev.target.value)));
  $("group-select").addEventListener("change", (ev) => setGroup(Number(ev.target.value)));
  $("estimator-select").addEventListener("change", (ev) => { S.est = ev.target.value; render(); });
  $("compare-select").addEventListener("change", (ev) => { S.cmp = ev.target.value; render(); });
  $("spread-filter").addEventListener("change", (ev) => setFilter(ev.target.checked));

  const KEYS = {
    ArrowLeft: ["previous iteration", () => setIteration(S.it - 1)],
    ArrowRight: ["next iteration", () => setIteration(S.it + 1)],
    ArrowUp: ["previous prompt", () => stepGroup(-1)],
    ArrowDown: ["next prompt", () => stepGroup(1)],
    s: ["only groups with reward spread (on/off)", () => setFilter(!S.only)],
    j: ["next response", () => { S.resp = Math.min(S.resp + 1, nResp() - 1); render(); }],
    k: ["previous response", () => { S.resp = Math.max(S.resp - 1, 0); render(); }],
    e: ["next estimator", () => { S.est = cycle(cur().order, S.est, 1); render(); }],
    E: ["previous estimator", () => { S.est = cycle(cur().order, S.est, -1); render(); }],
    c: ["next compare estimator (or none)", () => { S.cmp = cycle([""].concat(cur().order), S.cmp, 1); render(); }],
    C: ["previous compare estimator", () => { S.cmp = cycle([""].concat(cur().order), S.cmp, -1); render(); }],
  };
  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || ["SELECT", "INPUT", "TEXTAREA"].includes(ev.target.tagName)) return;
    const k = KEYS[ev.key];
    if (!k) return;
    ev.preventDefault();
    k[1]();
  });
  const help = $("help");
  help.append("Keys: ");
  for (const [key, [what]] of Object.entries(KEYS)) {
    help.append(el("kbd", {}, key.replace("Arrow", "")), " " + what + "  ");
  }
  help.append("| mouse: click a response or token to select it, a chart to jump to the nearest saved iteration");
  $("run-name").textContent = D.run;
  fixGroup();
  render();
})();
