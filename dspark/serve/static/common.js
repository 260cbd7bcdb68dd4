// Shared by the dashboard and the race: the API key (asked once, kept for the
// browser tab) and authenticated requests.
"use strict";

const Live = {
  key: sessionStorage.getItem("dspark-key") || "",
  keyRequired: false,

  headers(extra) {
    const h = Object.assign({}, extra || {});
    if (this.key) h["Authorization"] = "Bearer " + this.key;
    return h;
  },

  // Resolves once the page may fetch data: asks for the key when the server wants one.
  async ready() {
    const cfg = await (await fetch("/dashboard/config")).json();
    this.keyRequired = cfg.key_required;
    document.querySelectorAll(".model-name").forEach(e => { e.textContent = cfg.model; });
    if (!this.keyRequired || this.key) return;
    await this.askKey("");
  },

  askKey(message) {
    const box = document.getElementById("key-box");
    const form = document.getElementById("key-form");
    document.getElementById("key-message").textContent = message ||
      "This server requires its API key (the one given to --api-key).";
    box.hidden = false;
    return new Promise(resolve => {
      form.onsubmit = ev => {
        ev.preventDefault();
        this.key = document.getElementById("key-input").value.trim();
        sessionStorage.setItem("dspark-key", this.key);
        box.hidden = true;
        resolve();
      };
    });
  },

  // fetch with the key; a 401 asks for the key again and retries
  async fetch(url, options) {
    for (;;) {
      const opts = Object.assign({}, options || {});
      opts.headers = this.headers(opts.headers);
      const r = await fetch(url, opts);
      if (r.status !== 401) return r;
      await this.askKey("The key was not accepted; enter the server's API key.");
    }
  },
};

function fmt(x, digits) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  return Number(x).toFixed(digits === undefined ? 1 : digits);
}
