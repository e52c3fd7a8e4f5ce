// The status page: polls status.json and shows it.
"use strict";

function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + " " + u[i];
}
function fmtNum(n) { return Math.round(n).toLocaleString("en-US"); }
function fmtRate(n) { return n >= 100 ? fmtNum(n) : n.toFixed(1); }

// show sets a figure's text and keeps its raw value in data-value.
function show(id, text, value) {
  const e = document.getElementById(id);
  e.textContent = text;
  e.dataset.value = value === undefined ? "" : String(value);
}

function render(st) {
  const s = st.stats;
  document.getElementById("name").textContent = st.name || "";
  document.title = "gowarp cache " + (st.name || "");
  show("keys", fmtNum(s.Keys), s.Keys);
  show("bytes", fmtBytes(s.Bytes), s.Bytes);
  show("blocks", fmtNum(s.Blocks), s.Blocks);
  show("resident", fmtNum(s.Resident) + " (" + fmtBytes(s.Resident * s.BlockSize) + ")", s.Resident);
  show("blockSize", fmtBytes(s.BlockSize), s.BlockSize);
  show("budget", fmtBytes(s.Budget), s.Budget);
  const used = s.Budget > 0 ? Math.min(1, s.Resident * s.BlockSize / s.Budget) : 0;
  document.getElementById("budgetBar").style.width = (100 * used).toFixed(1) + "%";

  const r = st.rates;
  show("ops", fmtRate(r.gets + r.puts + r.deletes), r.gets + r.puts + r.deletes);
  show("getsRate", fmtRate(r.gets), r.gets);
  show("putsRate", fmtRate(r.puts), r.puts);
  show("inRate", fmtBytes(r.bytesIn) + "/s", r.bytesIn);
  show("outRate", fmtBytes(r.bytesOut) + "/s", r.bytesOut);
  show("pagingRate", fmtRate(r.pageIns) + " / " + fmtRate(r.pageOuts));

  show("gets", fmtNum(s.Gets), s.Gets);
  show("hitsMisses", fmtNum(s.Hits) + " / " + fmtNum(s.Misses), s.Hits + "/" + s.Misses);
  show("hitRatio", st.hitRatio < 0 ? "–" : (100 * st.hitRatio).toFixed(1) + " %", st.hitRatio);
  show("puts", fmtNum(s.Puts), s.Puts);
  show("deletes", fmtNum(s.Deletes), s.Deletes);
  show("paging", fmtNum(s.PageIns) + " / " + fmtNum(s.PageOuts), s.PageIns + "/" + s.PageOuts);
  show("errors", fmtNum(s.Errors), s.Errors);
  show("conns", "(" + s.Conns + ")", s.Conns);

  const body = document.getElementById("clients");
  body.replaceChildren(...st.clients.map(c => {
    const tr = document.createElement("tr");
    for (const v of [c.Addr, new Date(c.Since).toLocaleTimeString(), fmtNum(c.Requests)]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    return tr;
  }));

  const h = st.history;
  drawChart(document.getElementById("opsChart"), [
    {name: "gets", color: "#3b7dd8", points: h.map(p => [p.t, p.gets])},
    {name: "puts", color: "#e07b24", points: h.map(p => [p.t, p.puts])},
    {name: "deletes", color: "#999999", points: h.map(p => [p.t, p.deletes])},
  ], fmtRate);
  drawChart(document.getElementById("bytesChart"), [
    {name: "in", color: "#2c9c5a", points: h.map(p => [p.t, p.bytesIn])},
    {name: "out", color: "#8a4fc7", points: h.map(p => [p.t, p.bytesOut])},
  ], v => fmtBytes(v));
  document.body.dataset.updated = String(st.time);
}

let interval = 1000;
async function poll() {
  const state = document.getElementById("state");
  try {
    const resp = await fetch("status.json", {cache: "no-store"});
    if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
    const st = await resp.json();
    interval = st.intervalMs || interval;
    render(st);
    state.textContent = "live, every " + (interval / 1000) + " s";
    state.className = "state";
  } catch (err) {
    state.textContent = "server unreachable: " + err.message;
    state.className = "state down";
  }
  setTimeout(poll, interval);
}
poll();
