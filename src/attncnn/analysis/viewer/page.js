"use strict";
// The viewer page's interface: state, drawing, controls (the data side is decode.js).
(() => {
  const { base64Bytes, blobReader, mapValues } = attncnnData;
  const $ = (id) => document.getElementById(id);
  const M = JSON.parse($("attncnn-manifest").textContent);
  const body = document.body;
  const blobArrays = blobReader(M);

  // ---------------------------------------------------------------- state
  const state = { run: 0, image: null, query: [0, 0], kind: "all", softmax: true, scale: "map", view: "maps" };
  let current = [];                          // current[layer][head] = Float64Array of the shown values
  let currentCenters = [];
  let renderId = 0;

  const run = () => M.runs[state.run];
  const imageEntry = () => run().images.find((e) => e.key === state.image) || run().images[0];
  // Rollout (Abnar & Zuidema 2020) is one map per layer: the attention flow through every block up to it.
  const rollout = () => state.kind === "rollout";
  const headsOf = (l) => (rollout() ? 1 : run().heads[l]);
  const maxHeads = () => (rollout() ? 1 : Math.max(...run().heads));

  // ---------------------------------------------------------------- colours
  // Own colour ramp: deep navy -> blue -> teal -> green-yellow -> pale yellow.
  const RAMP = [[18, 22, 58], [38, 84, 164], [33, 160, 160], [170, 214, 76], [252, 246, 186]];
  function colour(t) {
    t = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(t)), f = t - i, a = RAMP[i], b = RAMP[i + 1];
    return [0, 1, 2].map((c) => Math.round(a[c] + (b[c] - a[c]) * f));
  }
  const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
  const headColour = (h, n) => `hsl(${Math.round((h * 360) / Math.max(1, n))}, 78%, 42%)`;

  function range(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
    return [lo, hi];
  }

  const fmt = (v) => (Math.abs(v) >= 1000 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2) : v.toFixed(4));

  // The query cell: a black outer and a white inner outline, visible on any image or colour.
  function outlineCell(ctx, x, y, w, h, line) {
    ctx.lineWidth = line;
    ctx.strokeStyle = "#000";
    ctx.strokeRect(x + line / 2, y + line / 2, w - line, h - line);
    ctx.strokeStyle = "#fff";
    ctx.strokeRect(x + 1.5 * line, y + 1.5 * line, w - 3 * line, h - 3 * line);
  }

  // ---------------------------------------------------------------- image panel
  const imageCache = new Map();
  function imageCanvasOf(entry) {
    if (!imageCache.has(entry)) {
      const [h, w] = entry.size, bytes = base64Bytes(entry.pixels);
      const c = document.createElement("canvas");
      c.width = w; c.height = h;
      const ctx = c.getContext("2d"), data = ctx.createImageData(w, h);
      for (let i = 0; i < w * h; i++) {
        data.data[4 * i] = bytes[3 * i]; data.data[4 * i + 1] = bytes[3 * i + 1];
        data.data[4 * i + 2] = bytes[3 * i + 2]; data.data[4 * i + 3] = 255;
      }
      ctx.putImageData(data, 0, 0);
      imageCache.set(entry, c);
    }
    return imageCache.get(entry);
  }

  function drawImagePanel() {
    const canvas = $("image-canvas"), ctx = canvas.getContext("2d"), [H, W] = run().grid;
    const entry = imageEntry(), src = imageCanvasOf(entry);
    const side = 288, scale = side / Math.max(src.width, src.height);
    canvas.width = Math.round(src.width * scale); canvas.height = Math.round(src.height * scale);
    canvas.style.width = canvas.width + "px"; canvas.style.height = canvas.height + "px";
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(src, 0, 0, canvas.width, canvas.height);
    const cw = canvas.width / W, ch = canvas.height / H;
    ctx.strokeStyle = "rgba(255,255,255,0.35)"; ctx.lineWidth = 1;
    ctx.beginPath();
    for (let j = 1; j < W; j++) { ctx.moveTo(Math.round(j * cw) + 0.5, 0); ctx.lineTo(Math.round(j * cw) + 0.5, canvas.height); }
    for (let i = 1; i < H; i++) { ctx.moveTo(0, Math.round(i * ch) + 0.5); ctx.lineTo(canvas.width, Math.round(i * ch) + 0.5); }
    ctx.stroke();
    const [qr, qc] = state.query;
    outlineCell(ctx, qc * cw, qr * ch, cw, ch, 2);
    $("query-info").textContent = `query token: row ${qr}, column ${qc} of a ${H} × ${W} token grid ` +
      "(click the image or use the arrow keys)";
    const pred = entry.prediction ? ` — model predicts ${entry.prediction.class} (p = ${entry.prediction.p.toFixed(2)})` : "";
    $("image-note").textContent = entry.label + pred +
      (run().position_only ? ". Position-only attention: the maps are the same for every image." : "");
  }

  function buildThumbs() {
    const box = $("thumbs");
    box.textContent = "";
    for (const entry of run().images) {
      const b = document.createElement("button");
      b.className = "thumb"; b.type = "button"; b.dataset.key = entry.key; b.title = entry.label;
      const c = document.createElement("canvas"), src = imageCanvasOf(entry);
      c.width = src.width; c.height = src.height;
      c.getContext("2d").drawImage(src, 0, 0);
      const label = document.createElement("span");
      label.textContent = entry.key === "average" ? `avg ${run().average}` : `#${entry.key}`;
      b.append(c, label);
      b.addEventListener("click", () => api.setImage(entry.key));
      box.append(b);
    }
  }

  // ---------------------------------------------------------------- maps view
  let cellPx = 6;
  function buildMapsTable() {
    const table = $("maps-table"), r = run(), [H, W] = r.grid;
    cellPx = Math.max(2, Math.floor(96 / Math.max(H, W)));
    table.textContent = "";
    const head = table.insertRow();
    head.appendChild(document.createElement("th"));
    for (let h = 0; h < maxHeads(); h++) {
      const th = document.createElement("th");
      th.textContent = rollout() ? "rollout through the layer" : `head ${h + 1}`; head.appendChild(th);
    }
    for (let l = 0; l < r.layers; l++) {
      const row = table.insertRow();
      const th = document.createElement("th"); th.textContent = `layer ${l + 1}`; row.appendChild(th);
      for (let h = 0; h < maxHeads(); h++) {
        const td = row.insertCell();
        if (h >= headsOf(l)) continue;
        const c = document.createElement("canvas");
        c.width = W * cellPx; c.height = H * cellPx;
        c.dataset.layer = l; c.dataset.head = h; c.className = "map";
        c.addEventListener("mousemove", (ev) => hover(ev, c));
        c.addEventListener("mouseleave", () => { $("readout").textContent = ""; });
        td.appendChild(c);
        if (r.gates && r.gates[l] && !rollout()) {   // GPSA: weight of the positional softmax in the head's mix
          const g = document.createElement("div"); g.className = "gate";
          g.textContent = `gate ${r.gates[l][h].toFixed(2)}`; td.appendChild(g);
        }
      }
    }
  }

  function hover(ev, c) {
    const [H, W] = run().grid, rect = c.getBoundingClientRect();
    const j = Math.min(W - 1, Math.floor(((ev.clientX - rect.left) / rect.width) * W));
    const i = Math.min(H - 1, Math.floor(((ev.clientY - rect.top) / rect.height) * H));
    const l = +c.dataset.layer, h = +c.dataset.head, v = current[l] && current[l][h] ? current[l][h][i * W + j] : NaN;
    const what = rollout() ? `rollout through layer ${l + 1}, input token` : `layer ${l + 1}, head ${h + 1}, key`;
    $("readout").textContent = `${what} (${i}, ${j}): ${fmt(v)}`;
  }

  function drawMaps() {
    const r = run(), [H, W] = r.grid, [qr, qc] = state.query;
    let globalRange = null;
    if (state.scale === "all") globalRange = range(current.flatMap((layer) => layer.flatMap((v) => [...range(v)])));
    for (const c of $("maps-table").querySelectorAll("canvas.map")) {
      const l = +c.dataset.layer, h = +c.dataset.head, values = current[l][h];
      let [lo, hi] = globalRange || (state.scale === "layer"
        ? range(current[l].flatMap((v) => [...range(v)])) : range(values));
      const ctx = c.getContext("2d");
      for (let i = 0; i < H; i++)
        for (let j = 0; j < W; j++) {
          const v = values[i * W + j];
          ctx.fillStyle = css(colour(hi > lo ? (v - lo) / (hi - lo) : 0.5));
          ctx.fillRect(j * cellPx, i * cellPx, cellPx, cellPx);
        }
      outlineCell(ctx, qc * cellPx, qr * cellPx, cellPx, cellPx, Math.max(1, Math.round(cellPx / 6)));
      const gate = r.gates && r.gates[l] && !rollout() ? `, gate ${r.gates[l][h].toFixed(3)}` : "";
      c.title = `${rollout() ? `rollout through layer ${l + 1}` : `layer ${l + 1}, head ${h + 1}`}${gate}: ` +
        `${fmt(lo)} … ${fmt(hi)}`;
    }
    const bar = $("legend-bar").getContext("2d");
    for (let x = 0; x < 160; x++) { bar.fillStyle = css(colour(x / 159)); bar.fillRect(x, 0, 1, 12); }
    if (state.scale === "all" && globalRange) {
      $("legend-lo").textContent = fmt(globalRange[0]); $("legend-hi").textContent = fmt(globalRange[1]);
      $("legend-note").textContent = "";
    } else {
      $("legend-lo").textContent = "min"; $("legend-hi").textContent = "max";
      $("legend-note").textContent = state.scale === "layer" ? "of each layer (hover a map for values)"
                                                              : "of each map (hover a map for values)";
    }
  }

  // ---------------------------------------------------------------- centers view
  function centersRadius() {
    let m = 1;
    for (const layer of run().centers)
      for (const head of layer)
        if (!head.degenerate) m = Math.max(m, Math.abs(head.center[0]), Math.abs(head.center[1]));
    return Math.min(Math.max(...run().grid), Math.max(3, Math.ceil(m + 1.5)));
  }

  function drawCenters() {
    const r = run(), box = $("centers"), R = centersRadius(), n = 2 * R + 1;
    const cell = Math.max(8, Math.floor(210 / n)), size = n * cell;
    const [H, W] = r.grid, [qr, qc] = state.query, src = imageCanvasOf(imageEntry());
    const pw = src.width / W, ph = src.height / H;
    box.textContent = "";
    currentCenters = [];
    r.centers.forEach((heads, l) => {
      const panel = document.createElement("div"); panel.className = "center-panel";
      const c = document.createElement("canvas"); c.width = size; c.height = size; c.dataset.layer = l;
      const ctx = c.getContext("2d");
      ctx.fillStyle = "#eef0f3"; ctx.fillRect(0, 0, size, size);
      ctx.imageSmoothingEnabled = false; ctx.globalAlpha = 0.45;
      for (let i = 0; i < n; i++)
        for (let j = 0; j < n; j++) {
          const tr = qr + i - R, tc = qc + j - R;
          if (tr >= 0 && tr < H && tc >= 0 && tc < W)
            ctx.drawImage(src, tc * pw, tr * ph, pw, ph, j * cell, i * cell, cell, cell);
        }
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "rgba(0,0,0,0.12)"; ctx.lineWidth = 1; ctx.beginPath();
      for (let k = 1; k < n; k++) {
        ctx.moveTo(k * cell + 0.5, 0); ctx.lineTo(k * cell + 0.5, size);
        ctx.moveTo(0, k * cell + 0.5); ctx.lineTo(size, k * cell + 0.5);
      }
      ctx.stroke();
      ctx.fillStyle = "#000"; ctx.fillRect(R * cell, R * cell, cell, cell);
      const tips = [];
      heads.forEach((head, h) => {
        const x = (R + head.center[1] + 0.5) * cell, y = (R + head.center[0] + 0.5) * cell;
        const col = headColour(h, heads.length);
        ctx.strokeStyle = col; ctx.lineWidth = 1.6;
        for (const [mass, dash] of [["50", []], ["90", [4, 3]]]) {
          const e = head.ellipses[mass];
          if (!e || head.degenerate) continue;
          const limit = 4 * size;
          ctx.setLineDash(dash); ctx.beginPath();
          ctx.ellipse(x, y, Math.min(limit, e[0] * cell), Math.min(limit, e[1] * cell), e[2], 0, 2 * Math.PI);
          ctx.stroke();
        }
        ctx.setLineDash([]);
        const rad = Math.max(4, cell * 0.3);
        ctx.beginPath(); ctx.arc(x, y, rad, 0, 2 * Math.PI);
        if (head.degenerate) { ctx.fillStyle = "#fff"; ctx.fill(); ctx.strokeStyle = col; ctx.lineWidth = 2; ctx.stroke(); }
        else { ctx.fillStyle = col; ctx.fill(); ctx.strokeStyle = "#fff"; ctx.lineWidth = 1.2; ctx.stroke(); }
        ctx.fillStyle = head.degenerate ? col : "#fff";
        ctx.font = `bold ${Math.round(rad * 1.3)}px system-ui, sans-serif`;
        ctx.textAlign = "center"; ctx.textBaseline = "middle"; ctx.fillText(String(h + 1), x, y + 0.5);
        currentCenters.push({ layer: l, head: h, row: head.center[0], col: head.center[1], x, y, cell, radius: R,
                              degenerate: head.degenerate });
        tips.push(`head ${h + 1}: Δ = (${head.center[0].toFixed(2)}, ${head.center[1].toFixed(2)})` +
                  (head.degenerate ? " degenerate" : ""));
      });
      c.title = tips.join("\n");
      const caption = document.createElement("div"); caption.textContent = `layer ${l + 1}`;
      panel.append(c, caption); box.append(panel);
    });
  }

  // ---------------------------------------------------------------- controls
  function syncControls() {
    const r = run();
    $("run-select").value = String(state.run);
    for (const opt of $("kind-select").options) opt.disabled = !r.kinds[opt.value];
    $("kind-select").value = state.kind;
    $("softmax").checked = state.softmax;
    $("softmax").disabled = rollout();
    $("scale-select").value = state.scale;
    $("view-select").querySelector('option[value="centers"]').disabled = !r.centers;
    $("view-select").value = state.view;
    $("maps-view").hidden = state.view !== "maps";
    $("centers-view").hidden = state.view !== "centers";
    for (const b of $("thumbs").children) b.classList.toggle("selected", b.dataset.key === imageEntry().key);
  }

  function describeRun() {
    const r = run(), parts = [`<b>${escapeHtml(r.name)}</b>`];
    if (r.preset) parts.push(`preset ${escapeHtml(r.preset)}`);
    parts.push(`attention ${escapeHtml(String(r.attention))}`);
    if (r.epoch != null) parts.push(`epoch ${r.epoch}`);
    if (r.accuracy) parts.push(`test accuracy <b>${(100 * r.accuracy.last).toFixed(2)} %</b> (last), ` +
                               `${(100 * r.accuracy.best).toFixed(2)} % best at epoch ${r.accuracy.best_epoch}`);
    else parts.push("test accuracy: not recorded");
    parts.push(`${r.layers} layers × ${maxHeads()} heads, ${r.grid[0]} × ${r.grid[1]} tokens`);
    if (r.parameters) parts.push(r.parameters >= 1e6 ? `${(r.parameters / 1e6).toFixed(2)} M parameters`
                                                     : `${r.parameters.toLocaleString("en")} parameters`);
    if (r.dataset) parts.push(`data ${escapeHtml(String(r.dataset))}`);
    $("run-info").innerHTML = parts.join(" · ");
  }

  function escapeHtml(s) {
    return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  function selectRun(index) {
    state.run = index;
    const r = run();
    if (!r.images.some((e) => e.key === state.image)) state.image = r.images[0].key;
    if (!r.kinds[state.kind]) state.kind = "all";
    if (state.view === "centers" && !r.centers) state.view = "maps";
    const [H, W] = r.grid;
    // the grid's center, as `attncnn plot` and the paper's Fig. 5 take it (attncnn.analysis.runs.default_query)
    state.query = [Math.floor(H / 2), Math.floor(W / 2)];
    describeRun(); buildThumbs(); buildMapsTable();
  }

  // ---------------------------------------------------------------- render
  async function render() {
    const id = ++renderId;
    body.dataset.state = "busy";
    try {
      syncControls();
      drawImagePanel();
      const r = run(), set = r.sets[imageEntry().set], A = await blobArrays(set.blob);
      if (id !== renderId) return;
      const [qr, qc] = state.query, query = qr * r.grid[1] + qc;
      current = [];
      for (let l = 0; l < r.layers; l++) {
        current.push([]);
        for (let h = 0; h < headsOf(l); h++)
          current[l].push(mapValues(r, set, A, state.kind, state.softmax, l, h, query));
      }
      if (state.view === "centers") drawCenters(); else drawMaps();
      body.dataset.renders = String(+body.dataset.renders + 1);
      body.dataset.state = "ready";
    } catch (err) {
      $("message").textContent = "Cannot show the maps: " + err.message;
      body.dataset.state = "error";
      throw err;
    }
  }

  const api = {
    manifest: M,
    state,
    setRun(i) { selectRun(+i); return render(); },
    setImage(key) { state.image = String(key); return render(); },
    setQuery(row, col) {
      const [H, W] = run().grid;
      state.query = [Math.max(0, Math.min(H - 1, row)), Math.max(0, Math.min(W - 1, col))];
      return render();
    },
    setKind(kind) {
      const before = rollout();
      if (run().kinds[kind]) state.kind = kind;
      if (rollout() !== before) buildMapsTable();         // one map per layer, or one per head
      return render();
    },
    setSoftmax(on) { state.softmax = !!on; return render(); },
    setScale(scale) { state.scale = scale; return render(); },
    setView(view) { state.view = view === "centers" && run().centers ? "centers" : "maps"; return render(); },
    /** The values shown for (layer, head) at the current query, keys row-major. */
    values(layer, head) { return Array.from(current[layer][head]); },
    /** The markers of the centers view: layer, head, Delta (row, col) and canvas position. */
    centers() { return currentCenters.map((c) => ({ ...c })); },
    ready: null,
  };
  window.attncnnViewer = api;

  // ---------------------------------------------------------------- wiring
  $("run-select").addEventListener("change", (e) => api.setRun(e.target.value));
  $("kind-select").addEventListener("change", (e) => api.setKind(e.target.value));
  $("softmax").addEventListener("change", (e) => api.setSoftmax(e.target.checked));
  $("scale-select").addEventListener("change", (e) => api.setScale(e.target.value));
  $("view-select").addEventListener("change", (e) => api.setView(e.target.value));
  $("image-canvas").addEventListener("click", (ev) => {
    const c = ev.currentTarget, rect = c.getBoundingClientRect(), [H, W] = run().grid;
    const col = Math.floor(((ev.clientX - rect.left) / rect.width) * W);
    const row = Math.floor(((ev.clientY - rect.top) / rect.height) * H);
    c.focus();
    api.setQuery(row, col);
  });
  $("image-canvas").addEventListener("keydown", (ev) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    const m = moves[ev.key];
    if (!m) return;
    ev.preventDefault();
    api.setQuery(state.query[0] + m[0], state.query[1] + m[1]);
  });

  if (M.version !== 1) {
    $("message").textContent = `This page holds viewer data version ${M.version}; it reads version 1.`;
    body.dataset.state = "error";
    return;
  }
  if (typeof DecompressionStream === "undefined") {
    $("message").textContent = "This browser has no DecompressionStream; open the file in a current " +
                               "Chromium, Firefox or Safari.";
    body.dataset.state = "error";
    return;
  }
  M.runs.forEach((r, i) => {
    const opt = document.createElement("option");
    opt.value = String(i); opt.textContent = r.name; $("run-select").append(opt);
  });
  selectRun(0);
  api.ready = render();
})();
