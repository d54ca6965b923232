// The index's filters, search, sorting and grouping, kept in the page's URL (index.html?vote=1&sort=level&desc=1),
// so that Back, a reload or a copied link shows the same rows; and a problem page's previous/next links, which
// follow the same URL state through the rows the index shows. The rows come from the site's data.js
// (window.VIEW_DATA, written by the build); nothing is read from anywhere else.
"use strict";

function loadData() {
  const data = window.VIEW_DATA;
  if (!data) return null;
  const rows = data.rows.map(([file, search, filters, sorts], n) => ({
    n, file, search,
    f: Object.fromEntries(data.filters.map((key, i) => [key, filters[i]])),
    s: Object.fromEntries(data.sorts.map(([key], i) => [key, sorts[i]])),
  }));
  return { ...data, rows, sortKeys: data.sorts.map(([key]) => key), groupKeys: data.groups.map(([key]) => key) };
}

// ------------------------------------------------------------------------------------------ state <-> URL
function readState(data) {
  const params = new URLSearchParams(location.search);
  const filters = {};
  for (const key of data.filters) {
    const value = params.get(key);
    if (value) filters[key] = value;
  }
  const sort = data.sortKeys.includes(params.get("sort")) ? params.get("sort") : data.sortKeys[0];
  const group = data.groupKeys.includes(params.get("group")) ? params.get("group") : "";
  return { filters, q: (params.get("q") || "").trim(), sort, desc: params.get("desc") === "1", group };
}

function queryOf(data, state) {
  const params = new URLSearchParams();
  for (const key of data.filters) if (state.filters[key]) params.set(key, state.filters[key]);
  if (state.q) params.set("q", state.q);
  if (state.sort !== data.sortKeys[0]) params.set("sort", state.sort);
  if (state.desc) params.set("desc", "1");
  if (state.group) params.set("group", state.group);
  const text = params.toString();
  return text ? "?" + text : "";
}

// ------------------------------------------------------------------------------------------ which rows, in what order
function matches(row, state) {
  for (const [key, value] of Object.entries(state.filters)) {
    const have = row.f[key];
    if (Array.isArray(have) ? !have.includes(value) : have !== value) return false;
  }
  return state.q === "" || row.search.includes(state.q.toLowerCase());
}

function compareValues(x, y) {
  if (typeof x === "number" && typeof y === "number") return x - y;
  return String(x).localeCompare(String(y), undefined, { numeric: true });
}

function ordered(data, state) {
  // every row: grouped (groups in their values' order, "" last), then by the sort key (missing values last,
  // whichever the direction), then in the set's order
  const sign = state.desc ? -1 : 1;
  const missing = (value) => value === null || value === undefined || value === "";
  return data.rows.slice().sort((a, b) => {
    if (state.group) {
      const x = a.f[state.group], y = b.f[state.group];
      if (x !== y) return missing(x) ? 1 : missing(y) ? -1 : compareValues(x, y);
    }
    const x = a.s[state.sort], y = b.s[state.sort];
    if (missing(x) !== missing(y)) return missing(x) ? 1 : -1;
    const by = missing(x) ? 0 : sign * compareValues(x, y);
    return by || a.n - b.n;
  });
}

// ------------------------------------------------------------------------------------------ the index
function writeControls(state) {
  for (const select of document.querySelectorAll("select[data-key]")) {
    select.value = state.filters[select.dataset.key] || "";
  }
  const set = (id, property, value) => {
    const element = document.getElementById(id);
    if (element) element[property] = value;
  };
  set("search", "value", state.q);
  set("sort", "value", state.sort);
  set("desc", "checked", state.desc);
  set("group", "value", state.group);
}

function readControls(data) {
  const filters = {};
  for (const select of document.querySelectorAll("select[data-key]")) {
    if (select.value !== "") filters[select.dataset.key] = select.value;
  }
  const value = (id, property, fallback) => {
    const element = document.getElementById(id);
    return element ? element[property] : fallback;
  };
  return { filters, q: value("search", "value", "").trim(), sort: value("sort", "value", data.sortKeys[0]),
           desc: value("desc", "checked", false), group: value("group", "value", "") };
}

function optionText(key, value) {
  const select = document.querySelector(`select[data-key="${CSS.escape(key)}"]`);
  const option = select && Array.from(select.options).find((o) => o.value === value);
  return option ? option.textContent : value;
}

function groupHeading(data, state, members, columns) {
  const key = state.group, value = members[0].f[key];
  const label = data.groups.find(([k]) => k === key)[1];
  const parts = [`${label}: ${value === "" ? "none" : optionText(key, value)}`, `${members.length} shown`];
  for (const [outcome, name] of data.outcomes) {
    const known = members.filter((row) => row.f[outcome] === "1" || row.f[outcome] === "0");
    if (known.length) parts.push(`${name} right ${(known.filter((row) => row.f[outcome] === "1").length /
      known.length).toFixed(3)}`);
  }
  const row = document.createElement("tr");
  row.className = "group";
  const cell = document.createElement("th");
  cell.colSpan = columns;
  cell.textContent = parts.join(" · ");
  row.appendChild(cell);
  return row;
}

function renderIndex(data, state) {
  const table = document.querySelector("table.problems");
  const body = table.tBodies[0];
  for (const heading of Array.from(body.querySelectorAll("tr.group"))) heading.remove();
  const lines = new Map(Array.from(body.rows, (line) => [Number(line.dataset.n), line]));
  const columns = table.tHead.rows[0].cells.length;
  const query = queryOf(data, state);
  const fragment = document.createDocumentFragment();
  let shown = 0, members = [], heading = null;
  const close = () => {
    if (heading) heading.replaceWith(groupHeading(data, state, members, columns));
  };
  for (const row of ordered(data, state)) {
    const line = lines.get(row.n);
    if (!line) continue;
    const keep = matches(row, state);
    line.hidden = !keep;
    if (keep) {
      shown += 1;
      if (state.group && (members.length === 0 || members[0].f[state.group] !== row.f[state.group])) {
        close();
        members = [];
        heading = fragment.appendChild(document.createElement("tr"));
      }
      members.push(row);
    }
    const link = line.querySelector("a");
    if (link) link.href = row.file + query;
    fragment.appendChild(line);
  }
  body.appendChild(fragment);
  close();
  for (const button of document.querySelectorAll("button.sort")) {
    const active = button.dataset.sort === state.sort;
    button.classList.toggle("active", active);
    button.dataset.direction = active ? (state.desc ? "descending" : "ascending") : "";
  }
  const count = document.getElementById("count");
  if (count) count.textContent = `${shown} of ${lines.size} problems shown`;
}

function setupIndex(data) {
  const apply = (state) => {
    writeControls(state);
    history.replaceState(null, "", location.pathname + queryOf(data, state) + location.hash);
    renderIndex(data, state);
  };
  const fromControls = () => apply(readControls(data));
  for (const control of document.querySelectorAll("select[data-key], #sort, #desc, #group")) {
    control.addEventListener("change", fromControls);
  }
  const search = document.getElementById("search");
  if (search) search.addEventListener("input", fromControls);
  for (const button of document.querySelectorAll("button.sort")) {
    button.addEventListener("click", () => {
      const state = readControls(data);
      state.desc = state.sort === button.dataset.sort ? !state.desc : false;
      state.sort = button.dataset.sort;
      apply(state);
    });
  }
  // the URL is the state: on load, and when Back restores the page (whatever the browser restored in the controls)
  const fromUrl = () => apply(readState(data));
  window.addEventListener("pageshow", fromUrl);
  fromUrl();
}

// ------------------------------------------------------------------------------------------ a problem page
function setupProblem(data, nav) {
  const fromUrl = () => {
    const state = readState(data), query = queryOf(data, state);
    const here = Number(nav.dataset.n);
    const rows = ordered(data, state);
    const at = rows.findIndex((row) => row.n === here);
    const kept = rows.filter((row) => matches(row, state));
    const before = rows.slice(0, at).reverse().find((row) => matches(row, state));
    const after = rows.slice(at + 1).find((row) => matches(row, state));
    const link = (rel, row) => {
      const anchor = nav.querySelector(`a[rel=${rel}]`);
      if (!anchor) return;
      anchor.hidden = !row;
      if (row) anchor.href = "../" + row.file + query;
    };
    link("prev", before);
    link("next", after);
    const up = nav.querySelector("a.up");
    if (up) up.href = "../index.html" + query;
    const position = document.getElementById("position");
    const place = kept.findIndex((row) => row.n === here);
    const of = `the ${kept.length} problems ${query ? "the index shows" : "of the site"}`;
    if (position) position.textContent = place >= 0 ? `${place + 1} of ${of}` : `not among ${of}`;
  };
  window.addEventListener("pageshow", fromUrl);
  fromUrl();
}

document.addEventListener("DOMContentLoaded", () => {
  const data = loadData();
  if (!data) return;
  const nav = document.getElementById("nav");
  if (document.querySelector("table.problems")) setupIndex(data);
  else if (nav && nav.dataset.n !== undefined) setupProblem(data, nav);
});
