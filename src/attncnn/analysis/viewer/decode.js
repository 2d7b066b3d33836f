"use strict";
// Decoding of the data embedded in the viewer page: base85 blobs, their arrays, and the values shown
// for a (layer, head, query). The layout is attncnn/analysis/viewer/encoding.py's; decode.py applies
// the same rules in numpy for the tests. Inlined into page.html by page.py; defines attncnnData.
const attncnnData = (() => {
  function base64Bytes(text) {
    const bin = atob(text.trim());
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  // Blobs: base85 text, RFC 1924 alphabet with "." in place of "<" (encoding.py), 4 bytes per 5 characters;
  // a last group of k < 5 characters holds k - 1 bytes and is padded with the top digit.
  const B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;.=>?@^_`{|}~";
  const B85_VALUE = new Int16Array(128).fill(-1);
  for (let i = 0; i < B85.length; i++) B85_VALUE[B85.charCodeAt(i)] = i;
  function base85Bytes(text) {
    text = text.trim();
    const full = Math.floor(text.length / 5), tail = text.length % 5;
    if (tail === 1) throw new Error("damaged data block (length)");
    const out = new Uint8Array(4 * full + (tail ? tail - 1 : 0));
    const group = (start, n) => {
      let v = 0;
      for (let k = 0; k < 5; k++) {
        const c = k < n ? B85_VALUE[text.charCodeAt(start + k) & 127] : 84;
        if (c < 0) throw new Error("damaged data block (character)");
        v = v * 85 + c;
      }
      return v;                                // < 2^32 for valid data; doubles hold it exactly
    };
    let o = 0;
    for (let g = 0; g < full; g++) {
      const v = group(5 * g, 5);
      out[o++] = (v >>> 24) & 255; out[o++] = (v >>> 16) & 255; out[o++] = (v >>> 8) & 255; out[o++] = v & 255;
    }
    if (tail) {
      const v = group(5 * full, tail);
      for (let k = 0; k < tail - 1; k++) out[o++] = (v >>> (24 - 8 * k)) & 255;
    }
    return out;
  }

  // blobReader(M)(index): Promise of {name: typed array} of the page's blob index, decoded once.
  function blobReader(M) {
    const decoded = new Map();
    return function blobArrays(index) {
      if (!decoded.has(index)) {
        decoded.set(index, (async () => {
          const bytes = base85Bytes(document.getElementById("attncnn-blob-" + index).textContent);
          const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
          const buffer = await new Response(stream).arrayBuffer();
          const arrays = {};
          for (const [name, spec] of Object.entries(M.blobs[index].arrays)) {
            const n = spec.shape.reduce((a, b) => a * b, 1);
            arrays[name] = spec.dtype === "uint8" ? new Uint8Array(buffer, spec.offset, n)
                                                  : new Float32Array(buffer, spec.offset, n);
          }
          return arrays;
        })());
      }
      return decoded.get(index);
    };
  }

  // One query's row of one head of one layer, decoded into out (length H*W); see encoding.py.
  function decodeRow(enc, A, head, query, H, W, out) {
    const N = H * W, r = head * N + query;
    if (enc.enc === "affine8") {
      const q = A[enc.q], lo = A[enc.lo][r], step = A[enc.step][r], base = r * N;
      if (enc.delta) {
        let acc = 0;
        for (let k = 0; k < N; k++) { acc = (acc + q[base + k]) & 255; out[k] = lo + acc * step; }
      } else {
        for (let k = 0; k < N; k++) out[k] = lo + q[base + k] * step;
      }
    } else if (enc.enc === "scaled8") {
      const q = A[enc.q], scale = A[enc.scale][r], base = r * N;
      if (enc.delta) {
        let acc = 0;
        for (let k = 0; k < N; k++) { acc = (acc + q[base + k]) & 255; out[k] = acc * scale; }
      } else {
        for (let k = 0; k < N; k++) out[k] = q[base + k] * scale;
      }
    } else if (enc.enc === "separable8") {
      const q = A[enc.q], lo = A[enc.lo][r], step = A[enc.step][r], base = r * (H + W);
      for (let i = 0; i < H; i++)
        for (let j = 0; j < W; j++) out[i * W + j] = lo + step * (q[base + i] + q[base + H + j]);
    } else {
      throw new Error("unknown encoding " + enc.enc);
    }
    return out;
  }

  function softmaxInPlace(s) {
    let m = -Infinity;
    for (let k = 0; k < s.length; k++) if (s[k] > m) m = s[k];
    let sum = 0;
    for (let k = 0; k < s.length; k++) { s[k] = Math.exp(s[k] - m); sum += s[k]; }
    for (let k = 0; k < s.length; k++) s[k] /= sum;
    return s;
  }

  // The values shown for (layer, head, query): the same rules as page_maps() in tests/analysis/viewer_oracle.py.
  function mapValues(run, set, A, kind, softmax, layer, head, query) {
    const [H, W] = run.grid, maps = set.maps;
    const dec = (name) => decodeRow(maps[name][layer], A, head, query, H, W, new Float64Array(H * W));
    if (kind === "rollout") return dec("rollout");       // already row-stochastic: no softmax
    let s;
    if (kind === "all" || (kind === "positional" && !maps.positional)) {
      if (softmax && maps.probs) return dec("probs");
      if (maps.scores) s = dec("scores");
      else {
        s = dec("content");
        if (maps.positional) { const p = dec("positional"); for (let k = 0; k < s.length; k++) s[k] += p[k]; }
      }
    } else {
      s = dec(kind);
    }
    return softmax ? softmaxInPlace(s) : s;
  }

  return { base64Bytes, blobReader, mapValues };
})();
