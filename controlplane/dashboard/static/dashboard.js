// weir dashboard: live fragments, countdowns and confirmation dialogs.
// Everything here is an enhancement; the pages work without it.
"use strict";

function fmtLeft(ms) {
  if (ms <= 0) return "now";
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  s = s % 60;
  if (d > 0) return "in " + d + "d " + h + "h";
  if (h > 0) return "in " + h + "h " + String(m).padStart(2, "0") + "m";
  if (m > 0) return "in " + m + "m " + String(s).padStart(2, "0") + "s";
  return "in " + s + "s";
}

function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const t = Date.parse(el.dataset.deadline);
    if (!isNaN(t)) el.textContent = fmtLeft(t - now);
  }
}

function openConfirm(link) {
  const dlg = document.getElementById("confirm");
  if (!dlg || typeof dlg.showModal !== "function") return false;
  const form = dlg.querySelector("form");
  form.action = link.dataset.action;
  dlg.querySelector(".confirm-title").textContent = link.dataset.confirm;
  dlg.querySelector(".confirm-what").textContent = link.dataset.what || "";
  dlg.querySelector(".confirm-go").textContent = link.textContent.trim();
  dlg.showModal();
  return true;
}

document.addEventListener("click", (ev) => {
  const link = ev.target.closest("a[data-confirm]");
  if (link && openConfirm(link)) { ev.preventDefault(); return; }
  if (ev.target.closest(".confirm-cancel")) document.getElementById("confirm").close();
  const sub = ev.target.closest("[data-confirm-submit]");
  if (sub && !window.confirm(sub.dataset.confirmSubmit)) ev.preventDefault();
});

// A setting saved as 0 that would leave agents without holds asks first.
document.addEventListener("submit", (ev) => {
  const form = ev.target.closest("form[data-confirm-zero]");
  if (!form) return;
  const v = (form.querySelector("input[name=value]") || {}).value || "";
  if (/^\s*0(s|ms|m|h)?\s*$/.test(v) && !window.confirm(form.dataset.confirmZero)) ev.preventDefault();
});

async function refresh(live) {
  const dlg = document.getElementById("confirm");
  if (document.hidden || (dlg && dlg.open) || live.dataset.paused === "true") return;
  try {
    const res = await fetch(live.dataset.fragment, { credentials: "same-origin", headers: { "Accept": "text/html" } });
    if (res.status === 401) { window.location.reload(); return; }
    if (!res.ok) return;
    live.innerHTML = await res.text();
    live.dataset.refreshed = String(Date.now());
    tick();
  } catch (e) { /* offline for a moment: the next round tries again */ }
}

document.addEventListener("DOMContentLoaded", () => {
  tick();
  setInterval(tick, 1000);
  const live = document.getElementById("live");
  if (live && live.dataset.fragment) {
    setInterval(() => refresh(live), Number(live.dataset.every) || 5000);
  }
  // A pause for the live refresh, so that rows hold still while they are
  // read.
  const pause = document.getElementById("live-pause");
  if (live && pause) {
    pause.hidden = false;
    pause.addEventListener("click", () => {
      const paused = live.dataset.paused !== "true";
      live.dataset.paused = String(paused);
      pause.textContent = paused ? "Resume live updates" : "Pause live updates";
      pause.setAttribute("aria-pressed", String(paused));
    });
  }
});
