// Refresh the page's main part in place every data-refresh seconds: the server renders it
// (?part=main returns only that part); a failed fetch leaves the page as it was and says so.
(function () {
  const main = document.querySelector("main[data-refresh]");
  if (!main) return;
  const every = 1000 * Number(main.dataset.refresh);
  async function refresh() {
    const url = new URL(window.location.href);
    url.searchParams.set("part", "main");
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.redirected) {  // signed out, or the token expired: the login page, whole
        window.location.assign(response.url);
        return;
      }
      if (!response.ok) throw new Error(response.status + " " + response.statusText);
      main.innerHTML = await response.text();
      main.dataset.updated = new Date().toISOString();
      document.body.classList.remove("stale");
    } catch (error) {
      document.body.classList.add("stale");
    }
    window.setTimeout(refresh, every);
  }
  window.setTimeout(refresh, every);
})();
