/* agentgym view: the page's script. It reads window.AGENTGYM (agentgym/view/page.py writes
   it) and draws a run's steps and episodes, or an eval report's tasks side by side. Older
   steps of a large run are side files, loaded by <script src> when picked (works from
   file://); each calls window.agentgymLoad(step, episodes, vocab). No network, no library. */
(function () {
  "use strict";
  var AG = window.AGENTGYM;
  var vocab = AG.vocab || {};
  var loaded = AG.steps || {};
  var state = { key: "i", dir: 1, filter: "all", env: "", step: null, waiting: null };

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function fmt(x) {
    if (x === null || x === undefined) return "\u2013";
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(3);
    return String(x);
  }
  function errorCount(e) {
    var n = 0;
    Object.keys(e.errors).forEach(function (k) { n += e.errors[k]; });
    return n;
  }
  var FILTERS = {
    all: function () { return true; },
    correct: function (e) { return e.correct; },
    incorrect: function (e) { return !e.correct && !e.unscorable; },
    truncated: function (e) { return e.truncated; },
    "tool errors": function (e) { return errorCount(e) > 0; },
    unscorable: function (e) { return e.unscorable; }
  };

  window.agentgymLoad = function (step, episodes, words) {
    Object.keys(words || {}).forEach(function (k) { vocab[k] = words[k]; });
    loaded[step] = episodes;
    if (state.waiting === step) { state.waiting = null; showStep(step); }
  };

  // -- one episode: the chat, then its tokens with the loss mask --------------------------

  var CALL = /<tool_call>([\s\S]*?)<\/tool_call>/g;
  var ERROR = /^\s*(error|traceback)|\berror:|exception/i;

  function textWithCalls(text, into) {
    var last = 0, match;
    CALL.lastIndex = 0;
    while ((match = CALL.exec(text)) !== null) {
      if (match.index > last) into.appendChild(el("div", "text", text.slice(last, match.index)));
      var pretty = match[1];
      try { pretty = JSON.stringify(JSON.parse(match[1]), null, 2); } catch (err) { /* as sent */ }
      into.appendChild(el("pre", "call", pretty));
      last = match.index + match[0].length;
    }
    if (last < text.length) into.appendChild(el("div", "text", text.slice(last)));
  }

  function message(role, content, name) {
    if (role === "system") {  // long and the same in every episode: folded
      var folded = el("details", "msg role-system");
      folded.appendChild(el("summary", "role", "system \u00b7 " + content.length + " characters"));
      folded.appendChild(el("div", "text", content));
      return folded;
    }
    var box = el("div", "msg role-" + role);
    var head = el("div", "role", role + (name ? " \u00b7 " + name : ""));
    box.appendChild(head);
    if (!/\S/.test(content)) {  // nothing to read: said in one line, not drawn as a tall box
      var what = content.length ? content.length + " whitespace characters" : "empty";
      box.appendChild(el("div", "text blank", "(" + what + ")"));
    } else if (role === "assistant") textWithCalls(content, box);
    else box.appendChild(el("div", "text", content));
    if (role === "tool" && ERROR.test(content)) box.classList.add("error");
    return box;
  }

  function chat(e) {
    var box = el("div", "chat");
    e.prompt.forEach(function (m) { box.appendChild(message(m.role, m.content, m.name)); });
    e.turns.forEach(function (turn, k) {
      var a = message("assistant", turn.action);
      a.querySelector(".role").textContent = "assistant \u00b7 turn " + (k + 1);
      box.appendChild(a);
      turn.observation.forEach(function (m) { box.appendChild(message(m.role, m.content, m.name)); });
    });
    return box;
  }

  function shown(text) {
    return text.replace(/\n/g, "\u21b5\n").replace(/\t/g, "\u2192");
  }

  function tokens(e, info) {
    var box = el("div", "tokens");
    if (!e.t) {
      box.appendChild(el("p", "note", "tokens not kept for this episode (run.episode_tokens)"));
      return box;
    }
    e.t.forEach(function (id, i) {
      var trained = e.m.charAt(i) === "1";
      var cls = "tok " + (trained ? "trained" : "masked") + (i < e.p ? " prompt" : "");
      var text = vocab[String(id)];
      var span = el("span", cls, text === undefined ? "\u27e8" + id + "\u27e9" : shown(text));
      var about = "id " + id + " \u00b7 " + JSON.stringify(text === undefined ? null : text) +
        " \u00b7 logprob " + fmt(e.l[i]) + " \u00b7 mask " + (trained ? 1 : 0) +
        " \u00b7 version " + e.v[i];
      span.title = about;
      span.addEventListener("mouseover", function () { info.textContent = about; });
      box.appendChild(span);
    });
    return box;
  }

  function figures(e) {
    var parts = Object.keys(e.parts).map(function (k) { return k + " " + fmt(e.parts[k]); });
    var line = "reward " + fmt(e.reward) + (e.adv !== null && e.adv !== undefined ?
      " \u00b7 advantage " + fmt(e.adv) : "") + " \u00b7 " + parts.join(", ") +
      " \u00b7 " + e.turns.length + " turns \u00b7 " + e.finish;
    var box = el("div", "figures", line);
    if (e.error) box.appendChild(el("div", "bad", "env error: " + e.error));
    if (e.reward_error) box.appendChild(el("div", "bad", "reward error: " + e.reward_error));
    return box;
  }

  function episode(e, title) {
    var box = el("div", "episode");
    box.appendChild(el("h3", null, title));
    box.appendChild(figures(e));
    box.appendChild(chat(e));
    var info = el("div", "tokinfo", "hover a token: id, text, logprob, mask, version");
    var legend = el("div", "legend");
    legend.appendChild(el("span", "tok trained", "trained on (mask 1)"));
    legend.appendChild(el("span", "tok masked prompt", "prompt (mask 0)"));
    legend.appendChild(el("span", "tok masked", "template, tool result (mask 0)"));
    box.appendChild(legend);
    box.appendChild(info);
    var samples = (e.samples || []).concat([e]);
    samples.forEach(function (s, k) {
      if (samples.length > 1) {
        var head = "sample " + (k + 1) + " of " + samples.length + " \u00b7 turns " +
          s.turns_in[0] + "\u2013" + (s.turns_in[1] - 1);
        box.appendChild(el("h4", "sample", head));
        box.appendChild(el("p", "note", s.opened_by ? "split at " + s.opened_by :
          "the episode's first sample"));
      }
      box.appendChild(tokens(s, info));
    });
    return box;
  }

  // -- a run: steps, the episode list, one episode -----------------------------------------

  var COLUMNS = [
    ["i", "#"], ["task", "task"], ["group", "group"], ["env", "env"], ["reward", "reward"],
    ["adv", "advantage"], ["parts", "reward parts"], ["turns", "turns"], ["calls", "calls"],
    ["errs", "tool errors"], ["flags", "flags"]
  ];

  function sortValue(e, key) {
    if (key === "turns") return e.turns.length;
    if (key === "errs") return errorCount(e);
    if (key === "parts" || key === "flags") return cell(e, key);  // text: equal rows group
    var v = e[key];
    return v === null || v === undefined ? -Infinity : v;
  }

  function cell(e, key) {
    if (key === "parts") {
      return Object.keys(e.parts).map(function (k) { return k + " " + fmt(e.parts[k]); }).join(", ");
    }
    if (key === "turns") return String(e.turns.length);
    if (key === "errs") {
      return Object.keys(e.errors).filter(function (k) { return e.errors[k]; })
        .map(function (k) { return k + " " + e.errors[k]; }).join(", ");
    }
    if (key === "flags") {
      return [e.correct ? "correct" : "", e.truncated ? "truncated" : "",
        e.unscorable ? "unscorable" : ""].filter(Boolean).join(" ");
    }
    return fmt(e[key]);
  }

  function listEpisodes(episodes) {
    var table = $("episodes");
    table.textContent = "";
    var head = el("tr");
    var hasEnv = episodes.some(function (e) { return e.env; });
    COLUMNS.forEach(function (c) {
      if (c[0] === "env" && !hasEnv) return;
      var th = el("th", state.key === c[0] ? "sorted" : null, c[1]);
      th.dataset.key = c[0];
      th.addEventListener("click", function () {
        state.dir = state.key === c[0] ? -state.dir : 1;
        state.key = c[0];
        listEpisodes(episodes);
      });
      head.appendChild(th);
    });
    table.appendChild(head);
    var rows = episodes.map(function (e, i) { e.i = i; return e; }).filter(function (e) {
      return FILTERS[state.filter](e) && (!state.env || e.env === state.env);
    });
    rows.sort(function (a, b) {
      var x = sortValue(a, state.key), y = sortValue(b, state.key);
      return (x < y ? -1 : x > y ? 1 : 0) * state.dir;
    });
    rows.forEach(function (e) {
      var tr = el("tr", "row" + (e.correct ? " correct" : "") + (e.unscorable ? " unscorable" : ""));
      COLUMNS.forEach(function (c) {
        if (c[0] === "env" && !hasEnv) return;
        tr.appendChild(el("td", null, cell(e, c[0])));
      });
      tr.addEventListener("click", function () {
        var detail = $("detail");
        detail.textContent = "";
        detail.appendChild(episode(e, "step " + state.step + " \u00b7 episode " + e.i +
          " \u00b7 " + e.task + " (group " + e.group + ")"));
        detail.scrollIntoView();
      });
      table.appendChild(tr);
    });
    $("count").textContent = rows.length + " of " + episodes.length + " episodes";
  }

  function showStep(step) {
    state.step = step;
    var episodes = loaded[step];
    var entry = AG.index.filter(function (x) { return x.step === step; })[0];
    $("step-label").textContent = "step " + step + (entry && entry.health.length ?
      " \u26a0 " + entry.health.join(", ") : "");
    $("step-list").value = String(step);
    $("step-slider").value = String(AG.index.indexOf(entry));
    if (!episodes) {
      state.waiting = step;
      $("count").textContent = "loading step " + step + "\u2026";
      var s = document.createElement("script");
      s.src = entry.file;
      s.onerror = function () { $("count").textContent = "could not read " + entry.file; };
      document.head.appendChild(s);
      return;
    }
    var envs = {};
    episodes.forEach(function (e) { if (e.env) envs[e.env] = true; });
    var pick = $("env");
    pick.textContent = "";
    pick.appendChild(el("option", null, "every env")).value = "";
    Object.keys(envs).sort().forEach(function (n) { pick.appendChild(el("option", null, n)).value = n; });
    pick.value = envs[state.env] ? state.env : "";
    pick.hidden = Object.keys(envs).length === 0;
    listEpisodes(episodes);
  }

  function runPage() {
    $("run").hidden = false;
    var list = $("step-list"), slider = $("step-slider");
    AG.index.forEach(function (x) {
      var o = el("option", null, "step " + x.step + " \u00b7 reward " + fmt(x.reward) +
        (x.health.length ? " \u26a0" : ""));
      o.value = String(x.step);
      list.appendChild(o);
    });
    slider.max = String(Math.max(0, AG.index.length - 1));
    list.addEventListener("change", function () { showStep(Number(list.value)); });
    slider.addEventListener("input", function () { showStep(AG.index[Number(slider.value)].step); });
    var filter = $("filter");
    Object.keys(FILTERS).forEach(function (f) { filter.appendChild(el("option", null, f)).value = f; });
    filter.addEventListener("change", function () { state.filter = filter.value; showStep(state.step); });
    $("env").addEventListener("change", function () { state.env = $("env").value; showStep(state.step); });
    if (AG.index.length) showStep(AG.index[AG.index.length - 1].step);
    else $("count").textContent = "no episode files in this run (run.log_episodes)";
  }

  // -- an eval report: tasks, both models' episodes side by side ---------------------------

  function evalPage() {
    $("eval").hidden = false;
    var roles = Object.keys(AG.models);
    var table = $("tasks");
    var head = el("tr");
    var cols = ["task"];
    // correct: the greedy episode's strict correctness; reward: the mean over the greedy
    // episode and the samples, as the difference is
    roles.forEach(function (r) { cols.push(r + " correct (greedy)", r + " mean reward"); });
    if (roles.length > 1) cols.push("mean reward difference");
    cols.forEach(function (c) { head.appendChild(el("th", null, c)); });
    table.appendChild(head);
    AG.tasks.forEach(function (row) {
      var tr = el("tr", "row");
      tr.appendChild(el("td", null, row.task));
      roles.forEach(function (r) {
        tr.appendChild(el("td", row[r].correct ? "yes" : "no", row[r].correct ? "yes" : "no"));
        tr.appendChild(el("td", null, fmt(row[r].reward)));
      });
      if (roles.length > 1) tr.appendChild(el("td", row.diff > 0 ? "up" : row.diff < 0 ? "down" : null, fmt(row.diff)));
      tr.addEventListener("click", function () { compare(row.task, roles); });
      table.appendChild(tr);
    });
    if (AG.tasks.length) compare(AG.tasks[0].task, roles);
  }

  function played(role, task) {
    return AG.models[role].filter(function (e) { return e.task === task; });
  }

  function compare(task, roles) {
    var box = $("compare");
    box.textContent = "";
    box.appendChild(el("h2", null, task));
    var pick = el("select");
    var first = played(roles[0], task);
    var samples = [["greedy", true, 0]];
    first.forEach(function (e) { if (!e.greedy) samples.push(["sample " + e.sample, false, e.sample]); });
    samples.forEach(function (s, k) { pick.appendChild(el("option", null, s[0])).value = String(k); });
    box.appendChild(pick);
    var sides = el("div", "sides");
    box.appendChild(sides);
    function draw() {
      var s = samples[Number(pick.value)];
      sides.textContent = "";
      roles.forEach(function (role) {
        var side = el("div", "side " + role);
        var e = played(role, task).filter(function (x) {
          return x.greedy === s[1] && (s[1] || x.sample === s[2]);
        })[0];
        if (e) side.appendChild(episode(e, role + " \u00b7 " + s[0]));
        else side.appendChild(el("p", "note", role + ": not kept (eval.save_episodes)"));
        sides.appendChild(side);
      });
    }
    pick.addEventListener("change", draw);
    draw();
  }

  document.title = "agentgym view \u00b7 " + AG.title;
  $("title").textContent = AG.title + (AG.kind === "eval" ? " (evaluation)" : " (training run)");
  if (AG.kind === "run") runPage(); else evalPage();
  document.body.dataset.ready = "1";
})();
