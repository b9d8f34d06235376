// Queue page: reload its tables every few seconds (the server renders them), so who holds and
// who waits stays current without a page reload. A pause reason being typed is not lost: the
// tables are left alone while focus is in one of their inputs.
(function () {
  const box = document.getElementById("queue-tables");
  if (!box) return;
  const url = box.dataset.url;
  const every = 1000 * Number(box.dataset.refreshS || 3);
  setInterval(async () => {
    if (box.contains(document.activeElement) && document.activeElement.tagName === "INPUT") return;
    try {
      const response = await fetch(url, {headers: {"Accept": "text/html"}, credentials: "same-origin"});
      if (response.ok) box.innerHTML = await response.text();
    } catch (err) {
      console.warn("queue refresh failed, retrying", err);
    }
  }, every);
})();
