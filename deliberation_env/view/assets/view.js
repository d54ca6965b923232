// Filters of the index pages: every <select data-key="K"> keeps the rows whose data-K equals its value
// ("" keeps all); the search box keeps rows whose text contains its text. No data is read from
// anywhere but the page's own attributes.
"use strict";

function applyFilters() {
  const table = document.querySelector("table.problems");
  if (!table) return;
  const chosen = Array.from(document.querySelectorAll("select[data-key]"))
    .filter((select) => select.value !== "")
    .map((select) => [select.dataset.key, select.value]);
  const search = document.getElementById("search");
  const needle = search ? search.value.trim().toLowerCase() : "";
  let shown = 0;
  const rows = table.tBodies[0].rows;
  for (const row of rows) {
    const keep = chosen.every(([key, value]) => row.dataset[key] === value) &&
      (needle === "" || row.textContent.toLowerCase().includes(needle));
    row.hidden = !keep;
    if (keep) shown += 1;
  }
  const count = document.getElementById("count");
  if (count) count.textContent = `${shown} of ${rows.length} problems shown`;
}

document.addEventListener("DOMContentLoaded", () => {
  for (const select of document.querySelectorAll("select[data-key]")) {
    select.addEventListener("change", applyFilters);
  }
  const search = document.getElementById("search");
  if (search) search.addEventListener("input", applyFilters);
  applyFilters();
});
