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
    // Each partition rule's parameters (data-partition-rule) are shown for that rule only; the
    // server sends only the chosen rule's anyway, so without JavaScript the form still works.
    // Each aggregator's parameters (data-aggregation) likewise.
    const showOwn = (select, inputs, owner) => {
      const update = () => {
        for (const input of inputs) {
          const mine = owner(input) === select.value;
          input.disabled = !mine;
          input.closest("label").hidden = !mine;
        }
      };
      select.addEventListener("change", update);
      update();
    };
    const partition = document.querySelector("#experiment-form select[name=partition_rule]");
    if (partition) {
      const inputs = [...document.querySelectorAll("#experiment-form input[data-partition-rule]")];
      showOwn(partition, inputs, (input) => input.dataset.partitionRule);
    }
    const aggregation = document.querySelector("#experiment-form select[name=aggregation]");
    if (aggregation) {
      const inputs = [...document.querySelectorAll("#experiment-form input[data-aggregation]")];
      showOwn(aggregation, inputs, (input) => input.dataset.aggregation);
    }

    // The data folder is shown for data sets that read files (data-needs-root on their option).
    const dataset = document.querySelector("#task-form select[name=dataset]");
    const root = document.querySelector("#task-form input[name=dataset_root]");
    if (dataset && root) {
      const update = () => {
        const option = dataset.selectedOptions[0];
        const needed = !option || option.dataset.needsRoot !== "false";
        root.disabled = !needed;
        root.closest("label").hidden = !needed && !root.value;  // a typed path stays visible
      };
      dataset.addEventListener("change", update);
      update();
    }

    const runForm = document.querySelector("form.run-form");
    if (runForm) {
      const planned = (runForm.dataset.planned || "").split(" ");
      const options = [...runForm.querySelectorAll("select[name=objective], select[name=slack], select[name=replan]")];
      follow(runForm.querySelector("select[name=strategy]"), options, (value) => planned.includes(value));
    }
  });
})();
