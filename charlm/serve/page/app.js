// The page of `charlm serve`: Write (streamed samples), Read (surprisal per character), Look inside
// (one unit's activation per character). Plain script, no dependencies: it talks only to /v1.
"use strict";

const $ = (id) => document.getElementById(id);
const MAX_BITS = 8;  // the top of the surprisal scale
let models = [], streaming = null, looked = null;

function headers() {
  const h = {"Content-Type": "application/json"};
  if ($("key").value) h.Authorization = "Bearer " + $("key").value;
  return h;
}

async function call(path, body, signal) {
  const response = await fetch(path, {method: body ? "POST" : "GET", headers: headers(),
                                      body: body ? JSON.stringify(body) : undefined, signal});
  if (response.status === 401) $("key-box").hidden = false;
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function model() { return $("model").value || undefined; }
function number(id) { const v = $(id).value; return v === "" ? undefined : Number(v); }
function fail(where, error) { $(where).textContent = error.message; $(where).classList.add("error"); }
function say(where, text) { $(where).textContent = text; $(where).classList.remove("error"); }

// A span per symbol; a line break shows as ↵ and breaks the line.
function symbolSpan(symbol) {
  const span = document.createElement("span");
  span.className = "c";
  span.textContent = symbol === "\n" ? "↵\n" : symbol;
  return span;
}

function surpriseColour(bits) {  // white → yellow → red over 0 … MAX_BITS
  const t = Math.max(0, Math.min(1, bits / MAX_BITS));
  return `hsl(${Math.round(55 - 55 * t)}, 95%, ${Math.round(100 - 45 * t)}%)`;
}

function activationColour(value) {  // blue (−1) … white (0) … red (+1), as in the char-rnn pictures
  const t = Math.max(-1, Math.min(1, value));
  return t >= 0 ? `hsl(5, 85%, ${Math.round(100 - 45 * t)}%)` : `hsl(215, 85%, ${Math.round(100 + 45 * t)}%)`;
}

// --- models -------------------------------------------------------------------------------------
async function loadModels() {
  try {
    models = (await (await call("/v1/models")).json()).models;
  } catch (error) { fail("about", error); return; }
  $("model").innerHTML = "";
  for (const m of models) $("model").append(new Option(m.name, m.name));
  showModel();
}

function showModel() {
  const m = models.find((x) => x.name === $("model").value) || models[0];
  if (!m) return;
  const score = m.test_bpc == null ? "" : `, test ${m.test_bpc.toFixed(3)} bpc`;
  say("about", `${m.cell}, ${m.layers}×${m.hidden_size}, ${m.parameters.toLocaleString()} parameters, ` +
               `${m.corpus}${score}`);
  $("layer").innerHTML = "";
  for (let i = 0; i < m.layers; i++) $("layer").append(new Option(String(i), String(i)));
  $("quantity").disabled = !m.has_memory;
  if (!m.has_memory) $("quantity").value = "hidden";
}

// --- Write --------------------------------------------------------------------------------------
async function generate() {
  const out = $("written");
  out.textContent = "";
  say("write-status", "");
  const prompt = $("prompt").value;
  const body = {model: model(), prompt: prompt === "" ? undefined : prompt, length: number("length"),
                temperature: number("temperature"), top_k: number("top_k"), top_p: number("top_p"),
                seed: number("seed"), stream: true};
  streaming = new AbortController();
  $("generate").disabled = true; $("stop").disabled = false;
  let drawn = 0, seed = null;
  try {
    const response = await call("/v1/sample", body, streaming.signal);
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = JSON.parse(buffer.slice(0, end).replace(/^data: /, ""));
        buffer = buffer.slice(end + 2);
        if (event.type === "start") {
          const p = document.createElement("span"); p.className = "prompt"; p.textContent = event.prompt;
          out.append(p);
          seed = event.seed; say("write-status", `seed ${seed}`);
        } else if (event.type === "text") {
          out.append(document.createTextNode(event.text)); drawn += event.text.length;
        } else if (event.type === "end") {
          say("write-status", `${event.symbols} symbols, seed ${seed}`);
        } else if (event.type === "error") {
          throw new Error(event.error);
        }
      }
    }
  } catch (error) {
    if (error.name === "AbortError") say("write-status", `stopped after ${drawn} characters`);
    else fail("write-status", error);
  } finally {
    streaming = null;
    $("generate").disabled = false; $("stop").disabled = true;
  }
}

// --- Read ---------------------------------------------------------------------------------------
async function score() {
  const out = $("scored");
  say("read-status", "scoring…");
  let result;
  try {
    result = await (await call("/v1/score", {model: model(), text: $("read-text").value, unknown: "skip", top: 5})).json();
  } catch (error) { fail("read-status", error); return; }
  out.textContent = "";
  out.append(symbolSpan(result.first));
  for (const c of result.per_char) {
    const span = symbolSpan(c.symbol);
    span.style.background = surpriseColour(c.surprisal);
    span.dataset.tip = JSON.stringify(c);
    out.append(span);
  }
  const skipped = result.skipped ? `, ${result.skipped} characters outside the vocabulary left out` : "";
  say("read-status", `${result.bits.toFixed(1)} bits in all, ${result.bpc.toFixed(3)} bits per character over ` +
                     `${result.characters} characters${skipped}`);
}

function showTip(event) {
  const span = event.target.closest("span.c");
  const tip = $("tip");
  if (!span || !span.dataset.tip) { tip.hidden = true; return; }
  const c = JSON.parse(span.dataset.tip);
  const shown = (s) => s === "\n" ? "↵" : s === " " ? "␣" : s;
  const rows = c.top.map((a) => `<tr><td>${escape(shown(a.symbol))}</td><td>${(100 * a.p).toFixed(1)}%</td></tr>`);
  tip.innerHTML = `<b>${escape(shown(c.symbol))}</b> ${c.surprisal.toFixed(2)} bits ` +
                  `(p ${(100 * Math.exp(c.logprob)).toFixed(1)}%)<table>${rows.join("")}</table>`;
  const box = span.getBoundingClientRect();
  tip.style.left = Math.min(box.left, window.innerWidth - 180) + "px";
  tip.style.top = (box.bottom + 4) + "px";
  tip.hidden = false;
}

function escape(text) {
  return text.replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]);
}

// --- Look inside --------------------------------------------------------------------------------
async function look() {
  say("inside-status", "reading…");
  const unit = number("unit");
  const body = {model: model(), text: $("inside-text").value, layer: number("layer") || 0, unknown: "skip",
                units: unit === undefined ? undefined : [unit], top: 12};
  try {
    looked = await (await call("/v1/activations", body)).json();
  } catch (error) { fail("inside-status", error); return; }
  const units = $("units");
  units.innerHTML = unit === undefined ? "most varying units: " : "";
  looked.units.forEach((u, row) => {
    const button = document.createElement("button");
    button.textContent = `unit ${u}`;
    button.addEventListener("click", () => paint(row));
    units.append(button);
  });
  paint(0);
}

function paint(row) {
  const values = $("quantity").value === "memory" && looked.memory ? looked.memory[row] : looked.hidden[row];
  const out = $("activated");
  out.textContent = "";
  looked.symbols.forEach((symbol, i) => {
    const span = symbolSpan(symbol);
    span.style.background = activationColour(values[i]);
    span.title = values[i].toFixed(3);
    out.append(span);
  });
  [...$("units").querySelectorAll("button")].forEach((b, i) => b.classList.toggle("on", i === row));
  say("inside-status", `layer ${looked.layer}, unit ${looked.units[row]} of ${looked.width}` +
                       `${looked.memory && $("quantity").value === "memory" ? " (cell memory)" : ""}`);
}

// --- wiring -------------------------------------------------------------------------------------
function view(name) {
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("on", b.dataset.view === name);
  for (const id of ["write", "read", "inside"]) $(id).hidden = id !== name;
  $("tip").hidden = true;
}

document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => view(b.dataset.view)));
$("model").addEventListener("change", showModel);
$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => streaming && streaming.abort());
$("score").addEventListener("click", score);
$("look").addEventListener("click", look);
$("quantity").addEventListener("change", () => looked && paint(Math.max(0,
  [...$("units").querySelectorAll("button")].findIndex((b) => b.classList.contains("on")))));
$("scored").addEventListener("mouseover", showTip);
$("scored").addEventListener("click", showTip);  // a tap on a phone
$("scored").addEventListener("mouseleave", () => { $("tip").hidden = true; });
$("key").addEventListener("change", loadModels);
$("surprise-bar").style.background = `linear-gradient(to right, ${[0, 2, 4, 6, 8].map(surpriseColour).join(", ")})`;
$("surprise-max").textContent = String(MAX_BITS);
$("activation-bar").style.background = `linear-gradient(to right, ${[-1, -0.5, 0, 0.5, 1].map(activationColour).join(", ")})`;
loadModels();
