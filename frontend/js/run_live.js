// Run page: draw the figures, then poll the run's live JSON until it ends, so a round in
// progress shows its progress without a page reload.
(function () {
  const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
  let lastFigures = {};

  function fmt(v, digits) {
    return v === null || v === undefined ? "—" : Number(v).toFixed(digits);
  }

  function renderProgress(p) {
    const bar = document.getElementById("progress-bar");
    bar.style.width = (100 * p.fraction).toFixed(1) + "%";
    // a failed or cancelled run's bar must not read as a finished one
    bar.className = "bar" + (p.status === "failed" || p.status === "cancelled" ? " " + p.status : "");
    const status = document.getElementById("run-status");
    status.textContent = p.status;
    status.className = "badge " + p.status;
    const cancel = document.getElementById("cancel-run-form");
    if (cancel && FINISHED.has(p.status)) cancel.remove();  // nothing left to cancel
    let text = `${p.rounds_done} of ${p.rounds_total} rounds done`;
    if (p.rounds_failed) text += ` (${p.rounds_failed} failed)`;
    if (p.current_round && p.current_round.status === "queued") {
      text += ` · round ${p.current_round.index} queued: waiting for its devices`;
    } else if (p.current_round && p.current_round.status === "aggregating") {
      text += ` · round ${p.current_round.index}: every device reported; FedAvg and evaluation`;
    } else if (p.current_round) {
      const c = p.current_round;
      text += ` · round ${c.index} ${c.status}: ${c.assignments_finished}/${c.assignments_total} assignments finished` +
        (c.assignments_running ? `, ${c.assignments_running} training` : "");
    } else if (p.phase && !FINISHED.has(p.phase) && p.phase !== "running") {
      text += ` · ${p.phase}`;
    }
    document.getElementById("progress-text").textContent = text;
  }

  // Who took part in a round: "all 12" or "100 of 10,000: dev-0003, dev-0107, … +95", with a
  // link to the round in the API, which lists every participant's id.
  function participantsCell(td, r) {
    const p = r.participants;
    if (!p) return;
    if (p.all) {
      td.textContent = `all ${p.of.toLocaleString("en")}`;
      return;
    }
    let text = `${p.count.toLocaleString("en")} of ${p.of.toLocaleString("en")}`;
    if (p.names.length) text += ": " + p.names.join(", ");
    if (p.more) text += `, … +${p.more.toLocaleString("en")}`;
    td.textContent = text + " ";
    td.className = "participants small";
    const link = document.createElement("a");
    link.href = `/api/rounds/${r.id}/`;
    link.textContent = "all ids";
    link.title = "every participant's device id (the API's round)";
    td.appendChild(link);
  }

  function renderRounds(rounds) {
    const body = document.querySelector("#rounds-table tbody");
    if (!body) return;  // a finished run without rounds has no table
    body.innerHTML = "";
    for (const r of rounds) {
      const tr = document.createElement("tr");
      const notes = [r.error, ...(r.flags || [])].filter(Boolean).join("; ");
      const cells = [r.index, r.status, null, fmt(r.queue_s, 1), fmt(r.round_time_s, 2), fmt(r.wall_time_s, 1),
        fmt(r.fl_throughput_sps, 1), fmt(r.raw_throughput_sps, 1), fmt(r.fair_throughput, 3), notes];
      cells.forEach((value, i) => {
        const td = document.createElement("td");
        if (i === 2) {
          participantsCell(td, r);
        } else if (i === 1) {
          const span = document.createElement("span");
          span.className = "badge " + value;
          span.textContent = value;
          td.appendChild(span);
        } else {
          td.textContent = value;
        }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
  }

  // The learning table (the chart's numbers): rebuilt whole, as the tasks appear with their
  // first checkpoints; the server words nothing here but the notes (data.run_live's "learning").
  function renderLearning(learning) {
    const table = document.getElementById("learning-table");
    if (!table || !learning) return;
    document.getElementById("learning-numbers").hidden = !learning.rounds.length;
    const shown = document.getElementById("learning-shown");
    shown.hidden = learning.shown >= learning.total;
    shown.querySelector(".shown").textContent = learning.shown;
    shown.querySelector(".total").textContent = learning.total;
    const head = table.tHead;
    head.innerHTML = "";
    const top = head.insertRow(), sub = head.insertRow();
    const first = document.createElement("th");
    first.rowSpan = 2;
    first.textContent = "Rounds done";
    first.title = "0: the initial model";
    top.appendChild(first);
    for (const task of learning.tasks) {
      const th = document.createElement("th");
      th.colSpan = 3;
      th.className = "task-head";
      th.textContent = task;
      top.appendChild(th);
      for (const name of ["Test accuracy", "Test loss", "Training loss"]) {
        const h = document.createElement("th");
        h.textContent = name;
        sub.appendChild(h);
      }
    }
    const body = table.tBodies[0];
    body.innerHTML = "";
    for (const r of learning.rounds) {
      const tr = body.insertRow();
      const th = document.createElement("th");
      th.scope = "row";
      th.className = "num";
      th.textContent = r.rounds_done;
      tr.appendChild(th);
      for (const c of r.cells) {
        if (!c) {
          const td = tr.insertCell();
          td.colSpan = 3;
          td.className = "muted";
          td.textContent = "—";
          continue;
        }
        const accuracy = tr.insertCell();
        accuracy.className = "num";
        if (c.note) accuracy.title = c.note;
        accuracy.textContent = c.test_accuracy === null ? (c.note || "—") : fmt(c.test_accuracy, 3);
        for (const v of [c.test_loss, c.train_loss]) {
          const td = tr.insertCell();
          td.className = "num";
          td.textContent = fmt(v, 4);
        }
      }
    }
  }

  function renderFigures(figures) {
    for (const [name, fig] of Object.entries(figures)) {
      const json = JSON.stringify(fig);
      const element = document.getElementById("fig-" + name);
      if (!element || lastFigures[name] === json) continue;  // left out: nothing to show
      lastFigures[name] = json;
      Plotly.react(element, fig.data, fig.layout, {responsive: true});
    }
  }

  // "queued: waiting for dev-a held by run 12 (alice) since …, estimated start …" while the
  // run's round waits in the lab's queue (the server words it: data.queue_banner).
  function renderQueueBanner(text) {
    const banner = document.getElementById("queue-banner");
    if (!banner) return;
    banner.hidden = !text;
    if (text) banner.firstChild.textContent = text + " ";
  }

  function render(live) {
    renderProgress(live.progress);
    renderQueueBanner(live.queue_banner);
    renderRounds(live.rounds);
    renderLearning(live.learning);
    renderFigures(live.figures);
  }

  window.startRunPage = function (initial, url) {
    render(initial);
    if (FINISHED.has(initial.progress.status)) return;
    const timer = setInterval(async () => {
      try {
        const response = await fetch(url, {headers: {"Accept": "application/json"}});
        if (!response.ok) return;
        const live = await response.json();
        render(live);
        if (FINISHED.has(live.progress.status)) clearInterval(timer);
      } catch (err) {
        console.warn("live update failed, retrying", err);
      }
    }, 2000);
  };
})();
