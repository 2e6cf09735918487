// Tidewater console: live fragments. Every element with data-live="URL" is replaced
// by a fresh copy of URL's HTML every data-every milliseconds, without reloading the
// page (one request at a time per element; a failed fetch keeps the old content and
// marks it stale). Written for this console; no library.
"use strict";
(function () {
  function refresh(el) {
    if (el.dataset.busy === "1") return;
    el.dataset.busy = "1";
    fetch(el.dataset.live, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        el.innerHTML = html;
        el.classList.remove("stale");
        el.dataset.updated = String(Date.now());
      })
      .catch(function () { el.classList.add("stale"); })
      .finally(function () { el.dataset.busy = "0"; });
  }
  function start() {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var every = parseInt(el.dataset.every || "2000", 10);
      refresh(el);
      setInterval(function () { refresh(el); }, Math.max(500, every));
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
