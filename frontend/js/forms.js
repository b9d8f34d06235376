// Dashboard forms: small helpers that only make the pages easier to use; every check on the
// values is the server's (the API's own messages).
(function () {
  // A form with data-confirm asks before it is sent (cancelling a run or a comparison).
  document.addEventListener("submit", (event) => {
    const message = event.target.dataset && event.target.dataset.confirm;
    if (message && !window.confirm(message)) event.preventDefault();
  });

  // Inputs that apply only to some choices are disabled otherwise (so they are not sent).
  function follow(select, inputs, applies) {
    const update = () => {
      for (const input of inputs) {
        input.disabled = !applies(select.value);
        input.closest("label").classList.toggle("disabled", input.disabled);
      }
    };
    select.addEventListener("change", update);
    update();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const partition = document.querySelector("#experiment-form select[name=partition_rule]");
    const alpha = document.querySelector("#experiment-form input[name=dirichlet_alpha]");
    if (partition && alpha) follow(partition, [alpha], (value) => value === "dirichlet");

    const runForm = document.querySelector("form.run-form");
    if (runForm) {
      const planned = (runForm.dataset.planned || "").split(" ");
      const options = [...runForm.querySelectorAll("select[name=objective], select[name=slack]")];
      follow(runForm.querySelector("select[name=strategy]"), options, (value) => planned.includes(value));
    }
  });
})();
