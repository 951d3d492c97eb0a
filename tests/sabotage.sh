#!/usr/bin/env bash
# Sabotage that must be caught, each plant by the test named to catch it: plants one bug at a
# time in the code, runs that test alone, and counts the plant caught only when that test
# fails (another failing test, an import error or a time-out does not count). Each planted run
# has a time limit (pytest-timeout), so a planted hang fails in seconds, not never. The tree is
# restored after each plant (and on any exit), so a run leaves `git diff` as it found it.
#
#   bash tests/sabotage.sh              # all of them (make test runs this)
#   bash tests/sabotage.sh mask         # only the plants whose name holds "mask"
#   PYTHON=.venv/bin/python bash tests/sabotage.sh
#   SABOTAGE_WORKERS=1 bash tests/sabotage.sh   # one plant at a time (default: cores + 1)
#
# Plants run side by side, each worker in its own copy of the working tree (worker 1 in the
# tree itself, the others in copies under a temporary folder, imported through PYTHONPATH),
# so two plants never meet. Plants in sandboxes/ run in the tree itself: a sandbox's own
# interpreter is started without our environment and imports the installed agentgym.
#
# Prints one line per plant, "caught by <test id>" or "NOT caught", in the order planted, and
# exits 1 when any plant was not caught.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-.venv/bin/python}
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
ONLY=${1:-}
LIMIT_S=${SABOTAGE_TIMEOUT_S:-240}
# a worker per core and one more: a planted run waits on its imports and subprocesses part of the time
WORKERS=${SABOTAGE_WORKERS:-$(($(nproc) + 1))}
# pytest explains a failed assertion in full where CI is set (no "Use -v to get more diff"):
# a plant's failure is reported here as CI reports it, a slow explanation included
export CI=${CI:-true}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
rc=0
names=() files=() olds=() news=() tests=()

# sabotage NAME FILE OLD NEW TEST_ID: queues a plant that replaces the one occurrence of OLD
# in FILE by NEW, runs the test TEST_ID (a parametrised test: all its cases) and expects it
# to fail.
sabotage() {
    [ -n "$ONLY" ] && [[ "$1" != *"$ONLY"* ]] && return 0
    names+=("$1") files+=("$2") olds+=("$3") news+=("$4") tests+=("$5")
}

# one_plant I: plants queued plant I in the current tree and writes its line to $work/I.out
# (and $work/I.missed when not caught).
one_plant() {
    local i=$1 started=$SECONDS attempt note=""
    local name=${names[$i]} test_id=${tests[$i]}
    # A run that neither passed nor failed as a catch (an error, a crash, a time-out) says
    # nothing of the plant, so it is planted and run once more; a test that passes with the
    # plant in (pytest exit 0) has missed it, and gets no second chance.
    for attempt in 1 2; do
        plant_and_run "$name" "${files[$i]}" "${olds[$i]}" "${news[$i]}" "$test_id"
        caught "$test_id" && break
        note="$note [run $attempt: pytest exit $rc: $(summary)]"
        [ "$rc" -eq 0 ] && break
    done
    if caught "$test_id"; then
        echo "sabotage: $name: caught by $test_id ($((SECONDS - started)) s)${note:+ after}$note" >"$work/$i.out"
    else
        { echo "sabotage: $name: NOT caught by $test_id:$note"; tail -n 5 "$backup/log"; } >"$work/$i.out"
        echo "$name:$note" >"$work/$i.missed"
    fi
}

# worker K: takes the next plant from the queue ($work/next, under a lock) until none is
# left; worker 0 plays in the tree itself and takes the sandboxes/ plants first, the others in
# a copy of the working tree.
worker() {
    local k=$1 i
    # (globals of this worker's subshell, for the EXIT trap's restore)
    backup=$(mktemp -d -p "$work") target=""
    trap 'restore' EXIT
    if [ "$k" -gt 0 ]; then
        local tree="$work/tree$k"
        mkdir -p "$tree"
        git ls-files -co --exclude-standard -z | xargs -0 -I{} sh -c '[ -e "$1" ] && cp --parents -P "$1" "$2"' _ {} "$tree"
        ln -s ../envs "$tree/agentgym/envs" && ln -s ../sandboxes "$tree/agentgym/sandboxes"
        cd "$tree" && export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
    else
        for i in "${!names[@]}"; do
            [[ "${files[$i]}" == sandboxes/* ]] && one_plant "$i"
        done
    fi
    while i=$(flock "$work/lock" sh -c 'n=$(cat "$1" 2>/dev/null || echo 0); echo $((n + 1)) >"$1"; echo "$n"' _ "$work/next") \
        && [ "$i" -lt "${#names[@]}" ]; do
        [[ "${files[$i]}" == sandboxes/* ]] || one_plant "$i"
    done
}

restore() { [ -n "${target:-}" ] && [ -f "$backup/file" ] && cp "$backup/file" "$target"; }

# plant_and_run NAME FILE OLD NEW TEST_ID: plants, runs the test (its log in $backup/log, its
# exit status in rc), and restores the file.
plant_and_run() {
    local name=$1 file=$2 old=$3 new=$4 test_id=$5
    target=$file
    cp "$file" "$backup/file"
    OLD=$old NEW=$new "$PYTHON" - "$file" <<'EOF' || { echo "sabotage: $name: the code to break is gone from $file; update tests/sabotage.sh"; exit 2; }
import os, sys
path, old, new = sys.argv[1], os.environ["OLD"], os.environ["NEW"]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
EOF
    # -rf: the summary's FAILED lines name each failing test. A planted hang ends in "+ Timeout +":
    # the thread method, since math-verify's signal.alarm would cancel the signal method's alarm
    "$PYTHON" -m pytest -q -rf -p no:cacheprovider --timeout="$LIMIT_S" -o timeout_method=thread \
        "$test_id" >"$backup/log" 2>&1
    rc=$?
    restore
    target=""
}

# caught TEST_ID: the last run failed by that test's assertions (not by a time-out)
caught() {
    [ "$rc" -eq 1 ] && grep -qF "FAILED $1" "$backup/log" && ! grep -q "+ Timeout +" "$backup/log"
}

# the last run's failures and tally, on one line
summary() {
    grep -E '^(FAILED|ERROR)|\+ Timeout \+|[0-9]+ (passed|failed|error)' "$backup/log" \
        | sed 's/^+* Timeout +*$/time-out/' | sort -u | tail -n 4 | tr '\n' ' '
}

# -- the learner and the advantages --------------------------------------------------------

sabotage "the advantage's sign flipped inside the learner" agentgym/learn/learner.py \
    "            micro.advantages," "            -micro.advantages," \
    tests/test_learner_gradient.py::test_the_applied_gradient_equals_the_plain_loss_gradient

sabotage "one micro-batch's weight halved" agentgym/learn/learner.py \
    "            weight = self._weight(micro, batch)" \
    "            weight = self._weight(micro, batch) * (0.5 if micro.input_ids.shape[1] == batch.input_ids.shape[1] else 1.0)" \
    tests/test_learner_gradient.py::test_the_applied_gradient_equals_the_plain_loss_gradient

sabotage "advantages normalised over the batch instead of per group" agentgym/learn/grpo.py \
    "    groups, valid = grouped(rewards, group_size, scorable)" \
    "    groups, valid = grouped(rewards, rewards.numel(), scorable)" \
    tests/test_pipeline.py::test_each_task_of_a_step_is_normalised_within_its_own_group

sabotage "the configured advantage estimator ignored for GRPO's" agentgym/learn/advantages.py \
    "    name = advantage_name(g)" \
    '    name = "group"' \
    tests/test_advantages.py::test_a_registered_estimator_gets_the_record_and_shapes_every_token_by_hand

sabotage "per-token advantages cut from the wrong end for a shorter batch" agentgym/types.py \
    "            advantages = advantages[:, : length - 1]" \
    "            advantages = advantages[:, advantages.shape[1] - (length - 1) :]" \
    tests/test_advantages.py::test_the_batch_keeps_each_row_s_per_token_advantages_through_dropped_rows_and_micro_batches

sabotage "a sampler with its own copy of the weights never refreshed" agentgym/rollout/sampler.py \
    "        if not self.copies_weights:" "        if True:" \
    tests/test_sampler.py::test_a_policy_with_its_own_copy_gets_the_weights_and_one_on_the_learner_s_model_not

sabotage "the clip range ignored" agentgym/learn/grpo.py \
    "ratio.clamp(1.0 - epsilon, 1.0 + high) * adv" "ratio * adv" \
    tests/test_grpo.py::test_ratio_above_clip_with_positive_advantage_has_zero_gradient

sabotage "the KL operands swapped" agentgym/learn/grpo.py \
    "    d = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)" \
    "    d = (logprobs - ref_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)" \
    tests/test_grpo.py::test_kl_k3_known_values

sabotage "a reward part's weight changed (the tool part)" agentgym/env/tool_env.py \
    '    {"correctness": 1.0, "tool": 0.5, "format": 0.1}' '    {"correctness": 1.0, "tool": 0.4, "format": 0.1}' \
    tests/test_tool_call_env.py::test_a_wrong_final_answer_scores_less

sabotage "a step's reward put one token before the last id its turn sampled" agentgym/types.py \
    '                last = end - 2  # token end - 1 is predicted at position end - 2' \
    '                last = end - 3' \
    tests/test_step_rewards.py::test_each_step_reward_sits_on_the_last_id_its_turn_sampled

# -- resume ---------------------------------------------------------------------------------

sabotage "the scheduler's state left out of the resume" agentgym/learn/learner.py \
    '        self.scheduler.load_state_dict(state["scheduler"])' '        pass' \
    tests/test_resume.py::test_n_steps_then_resume_for_m_more_is_bitwise_one_run_of_n_plus_m

sabotage "a full fine-tune's resume losing its KL reference (the start model)" agentgym/run/resume.py \
    "config, reference=model)" "config, reference=None)" \
    tests/test_resume.py::test_n_steps_then_resume_for_m_more_is_bitwise_one_run_of_n_plus_m

# -- the loss mask and the tokens --------------------------------------------------------

sabotage "the loss mask shifted by one token (rollout)" agentgym/rollout/episodes.py \
    "        loss_mask=tuple(ep.loss_mask)," "        loss_mask=(0, *ep.loss_mask[:-1])," \
    tests/test_rollout_mask_exact.py::test_the_mask_is_one_exactly_on_the_sampled_ids_and_their_logprobs_kept

sabotage "the loss mask shifted by one token (batch)" agentgym/types.py \
    "loss_mask[i, : k - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.float32)" \
    "loss_mask[i, : k - 1] = torch.tensor(t.loss_mask[:-1], dtype=torch.float32)" \
    tests/test_rollout.py::test_batch_aligns_masks_and_logprobs_with_target_tokens

sabotage "tool-result tokens given mask 1" agentgym/rollout/episodes.py \
    "        ep.loss_mask.extend([0] * len(more))" "        ep.loss_mask.extend([1] * len(more))" \
    tests/test_tool_rollout.py::test_mask_is_one_exactly_on_the_policys_tokens

sabotage "tool text tokenized with special tokens parsed" agentgym/rollout/conversation.py \
    "    return encode_rendered(tokenizer, Rendered(text[cut:], forged))" \
    "    return tokenizer.encode(text[cut:], add_special_tokens=False)" \
    "tests/test_special_tokens.py::test_a_tool_that_returns_turn_markers_cannot_forge_a_turn[tiny-random]"

# -- function calls judged ---------------------------------------------------------------------

sabotage "extra calls not counted against the tool part" agentgym/rewards/calls.py \
    "    return max(-1.0, (paid - 0.5 * match.extra) / len(match.expected))" \
    "    return max(-1.0, paid / len(match.expected))" \
    tests/test_call_matching.py::test_extra_calls_count_against_and_the_seed_part_floors_at_minus_one

sabotage "an expected call of a function the row does not offer let through" envs/tasks/table.py \
    "        if spec.name not in offered:" "        if spec.name not in offered:
            continue  # planted: an unoffered function let through
        if False:" \
    tests/test_calls_env.py::test_malformed_rows_are_refused_by_line_before_anything_runs

# -- BFCL's checker (string_match: bfcl) ---------------------------------------------------------

sabotage "bfcl strings standardized keeping hyphens" agentgym/rewards/bfcl.py \
    '_STANDARDIZE = re.compile(r"[ \,\.\/\-\_\*\^]")' '_STANDARDIZE = re.compile(r"[ \,\.\/\_\*\^]")' \
    tests/test_bfcl_match.py::test_strings_are_standardized_as_bfcl_does

sabotage "bfcl a listed argument left out as if it had a default" agentgym/rewards/bfcl.py \
    "        if key not in arguments and OMIT not in listed_values(spec, key):" \
    "        if False:" \
    tests/test_bfcl_match.py::test_defaults_both_ways

sabotage "bfcl int no longer accepted for a float" agentgym/rewards/bfcl.py \
    '    if kind == "float" and type(value) is int:' '    if False:' \
    tests/test_bfcl_agreement.py::test_bfcl_verdicts_agree_with_bfcls_own_checker

# -- the failure policy ---------------------------------------------------------------------

sabotage "a run of failed steps not stopped" agentgym/run/failures.py \
    "    if in_a_row < run.max_failed_steps:" "    if True:" \
    tests/test_failure_policy.py::test_a_run_whose_env_always_raises_stops_with_a_checkpoint_and_the_error

sabotage "a turn's env.step calls made one after another" agentgym/rollout/episodes.py \
    "    workers = env_workers or len(jobs)" "    workers = 1" \
    tests/test_env_workers.py::test_every_live_episodes_step_of_a_turn_is_made_at_once

sabotage "a hung env.step waited for" agentgym/rollout/episodes.py \
    '            lambda: ep.env.step(Completion(text, finish_reason)), timeout_s, "env.step"' \
    '            lambda: ep.env.step(Completion(text, finish_reason)), None, "env.step"' \
    tests/test_failure_policy.py::test_a_step_past_the_timeout_fails_its_episode_and_the_batch_goes_on

sabotage "preflight not making the env's sandbox" agentgym/run/preflight.py \
    '        sandbox = getattr(agent, "sandbox", None)' '        sandbox = None' \
    tests/test_preflight.py::test_train_without_a_way_to_isolate_code_stops_before_the_model_loads

sabotage "a crashing MCP server restarted on every call" agentgym/tools/mcp.py \
    "            self.failures += 1" "            self.failures += 0" \
    tests/test_mcp_restarts.py::test_a_server_crashing_on_every_call_is_restarted_max_restarts_times_then_given_up

sabotage "a Ray worker's call waited on without a timeout" agentgym/scale/ray_rollout.py \
    "            return self._ray.get(ref, timeout=self.timeout_s)" "            return self._ray.get(ref)" \
    tests/test_ray_rollout.py::test_a_restarted_worker_that_hangs_stops_the_run_naming_it

# -- the sandbox and the boundaries ----------------------------------------------------------

sabotage "the sandbox's privilege drop skipped" sandboxes/_bootstrap.py \
    '        drop_privileges(cfg["uid"])' '        pass' \
    tests/test_sandbox_claims.py::test_code_runs_under_a_uid_other_than_root

sabotage "no_new_privs left unset" sandboxes/_bootstrap.py \
    '    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS' '    pass' \
    tests/test_sandbox_claims.py::test_no_new_privs_is_set

sabotage "a system directory bound writable" sandboxes/local.py \
    '                args += ["--ro-bind", path, path]' '                args += ["--bind", path, path]' \
    tests/test_sandbox_claims.py::test_writing_into_a_system_path_fails_with_erofs

sabotage "/dev/shm left unbounded" sandboxes/local.py \
    '            args += ["--perms", "1777", "--size", size, "--tmpfs", path]' \
    '            args += ["--perms", "1777", "--tmpfs", path]' \
    tests/test_sandbox_claims.py::test_a_scratch_dir_takes_writes_up_to_its_cap_and_no_more

sabotage "/dev/shm hidden again by --dev (the old order)" sandboxes/local.py \
    '"--proc", "/proc", "--remount-ro", "/dev"' '"--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"' \
    tests/test_sandbox_claims.py::test_a_scratch_dir_takes_writes_up_to_its_cap_and_no_more

sabotage "the sandbox sharing the host's network" sandboxes/local.py \
    '        args += ["--unshare-pid", "--unshare-net"]' '        args += ["--unshare-pid"]' \
    tests/test_sandbox_claims.py::test_a_host_loopback_listener_is_reachable_from_outside_only

sabotage "the weight-sync TCPStore listening on every interface" agentgym/sync/collective.py \
    '        listener.bind(address)' '        listener.bind(("0.0.0.0", 0))' \
    tests/test_weight_sync.py::test_the_store_listens_on_the_address_it_is_given_only

# -- the endpoint and agent programs -----------------------------------------------------

sabotage "an agent's sampled turn re-tokenized from its text" agentgym/serve/recorder.py \
    '        sample.extend(gen.ids, gen, version)' \
    '        sample.extend(self._ids(self.text(prepared, gen))[: len(gen.ids)], gen, version)' \
    tests/test_serve.py::test_an_episodes_requests_are_one_sample_of_exactly_the_ids_sampled

sabotage "split samples left at full weight" agentgym/learn/advantages.py \
    '    return [1.0 / count] * count' '    return [1.0] * count' \
    tests/test_agents.py::test_split_samples_train_with_the_episodes_advantage_weighted

sabotage "an agent's exception ending the run" agentgym/serve/agent_thread.py \
    '    except BaseException as err:  # SystemExit, KeyboardInterrupt: the episode fails, not the run' \
    '    except ArithmeticError as err:  # SystemExit, KeyboardInterrupt: the episode fails, not the run' \
    tests/test_agents.py::test_a_faulty_agent_makes_an_unscorable_episode_and_leaves_no_port_open

sabotage "an agent's SystemExit ending its thread unreported" agentgym/serve/agent_thread.py \
    '    except BaseException as err:  # SystemExit, KeyboardInterrupt: the episode fails, not the run' \
    '    except Exception as err:  # SystemExit, KeyboardInterrupt: the episode fails, not the run' \
    tests/test_attacks_agents.py::test_an_agent_that_blocks_or_exits_fails_its_episode_in_bounded_time

sabotage "an episode's path taken with another episode's key" agentgym/serve/service.py \
    "        if recording is not None and not secrets.compare_digest(key or \"\", recording.token):" \
    "        if False:" \
    tests/test_attacks_agents.py::test_an_agent_calling_another_episodes_endpoint_is_refused_and_recorded_nowhere

sabotage "a disconnected client's sampling left to run" agentgym/policy/hf.py \
    "            if self._cancelled is not None:  # a cancelled row ends as cut (\"length\")" \
    "            if False:" \
    tests/test_attacks_serve.py::test_a_client_that_goes_away_has_its_sampling_cancelled_within_a_step

sabotage "continuous serve stepping one parameter set to its end before the next" \
    agentgym/serve/continuous.py \
    "            for params, stream in list(streams.items()):" \
    "            for params, stream in list(streams.items())[:1]:" \
    tests/test_attacks_serve.py::test_served_continuously_a_short_request_does_not_wait_for_a_long_one

sabotage "an agent's episode stepped past the registered turn limit" agentgym/serve/agents.py \
    '        agent_task = AgentTask(task.task_id, opening, tools, task, env)' \
    '        agent_task = AgentTask(task.task_id, opening, tools, task, env.unwrapped)' \
    tests/test_agents.py::test_the_registered_turn_limit_ends_an_agents_episode_as_it_ends_the_rollouts

sabotage "a checkpoint naming a folder of its run by its absolute path" agentgym/run/checkpoint.py \
    '        return os.path.relpath(path.resolve(), Path(origin).resolve())' \
    '        return str(path.resolve())' \
    tests/test_resume.py::test_resume_with_sft_and_evals_is_bitwise_one_run_after_the_folder_moved

sabotage "the endpoint listening on every interface" agentgym/serve/app.py \
    '        config = uvicorn.Config(app, host=host,' '        config = uvicorn.Config(app, host="0.0.0.0",' \
    tests/test_serve.py::test_the_server_listens_on_loopback_only

# -- asynchronous GRPO -------------------------------------------------------------------

sabotage "an async step played with the newest weights there, not the version the rule names" \
    agentgym/rollout/ahead.py \
    "                weights = self._take(version)
            try:" \
    "                version = max([version, *self._weights]); weights = self._take(version)
            try:" \
    tests/test_async.py::test_an_async_run_does_not_depend_on_timing

sabotage "an async checkpoint saving the task stream past the steps handed ahead" \
    agentgym/run/resume.py \
    '"run": self.submitted[0].stream if self.submitted else self.rng.bit_generator.state,' \
    '"run": self.rng.bit_generator.state,' \
    tests/test_async.py::test_a_stopped_async_run_resumed_trains_every_task_of_the_whole_run_once

sabotage "a resumed async run playing the steps handed ahead with the checkpoint's weights" \
    agentgym/rollout/ahead.py \
    "        wanted = range(max(self._first, step - self.k), step)" \
    "        wanted = range(step, step)" \
    tests/test_async.py::test_a_stopped_async_run_resumed_trains_every_task_of_the_whole_run_once

sabotage "trained.jsonl left uncut after a kill" agentgym/run/runlog.py \
    '    for name in ("metrics.jsonl", "completions.jsonl", "trained.jsonl"):' \
    '    for name in ("metrics.jsonl", "completions.jsonl"):' \
    "tests/test_async.py::test_an_async_run_killed_or_stopped_anywhere_trains_each_task_once_after_resume"

sabotage "a partial rollout continuing from the old weights' keys and values" agentgym/policy/hf.py \
    "            self._kept = {}" "            pass" \
    tests/test_async.py::test_partial_rollouts_take_new_weights_between_turns_recomputing_the_cache

sabotage "a partial rollout loading adapters into a merged model" agentgym/rollout/sampler.py \
    "        if merged is not None:  # between two turns: the old adapters out, the new ones in" \
    "        if False:  # between two turns: the old adapters out, the new ones in" \
    tests/test_async.py::test_partial_rollouts_take_new_weights_between_turns_recomputing_the_cache

sabotage "an evaluation leaving its weights in the sampler's policy" agentgym/rollout/ahead.py \
    "                if weights is not None:
                    self.inner.load_weights(_source(weights), version)
                elif" \
    "                if weights is not None:
                    pass
                elif" \
    tests/test_async.py::test_an_evaluation_holds_the_thread_and_the_sampler_plays_on_as_without_it

sabotage "async GRPO clipping around the sampler's stale logprobs (no decoupled objective)" \
    agentgym/run/setup.py \
    '        off_policy = ahead > 0 or self.policy.model is None' \
    '        off_policy = self.policy.model is None' \
    tests/test_async.py::test_with_k_1_each_step_trains_on_tokens_of_version_step_minus_2_and_logs_it

# -- continuous batching over turns ---------------------------------------------------------

sabotage "a joining turn drawing at the batch's token index, not its own" \
    agentgym/policy/hf_turns.py \
    "np.array([len(row.ids) for row in rows], np.uint64)" \
    "np.array([max(len(r.ids) for r in rows)] * len(rows), np.uint64)" \
    tests/test_turn_batching.py::test_a_turn_joining_a_running_batch_samples_what_it_samples_alone

sabotage "stacked rows padded on the right of the shorter part" agentgym/policy/kv_cache.py \
    "        mask[row : row + part_mask.shape[0], width - w :] = part_mask[:, lead:]" \
    "        mask[row : row + part_mask.shape[0], :w] = part_mask[:, lead:]" \
    tests/test_turn_batching.py::test_stacked_rows_are_left_padded_and_drop_columns_no_row_attends

sabotage "continuous turns waiting for every tool out" agentgym/rollout/episodes.py \
    "            if ordered or not len(turns):  # nothing decodes meanwhile: wait" \
    "            if True:" \
    tests/test_turn_batching.py::test_a_turn_waits_for_another_episodes_tool_only_when_told

# -- what is kept for the viewer ----------------------------------------------------------------

sabotage "an episode file's loss mask shifted by one token" agentgym/eval/episode_files.py \
    '        self.parts["loss_mask"].append(np.asarray(t.loss_mask, dtype=np.uint8))' \
    '        self.parts["loss_mask"].append(np.asarray((0, *t.loss_mask[:-1]), dtype=np.uint8))' \
    tests/test_episode_files.py::test_a_file_holds_each_episodes_tokens_mask_and_figures_by_hand

sabotage "the viewer drawing masked tokens as trained" agentgym/view/viewer.js \
    '      var trained = e.m.charAt(i) === "1";' \
    '      var trained = e.m.charAt(i) !== "";' \
    tests/test_viewer.py::test_the_run_page_shows_every_step_and_the_mask_on_the_exact_tokens

# -- checkpoints' integrity, exact ids, credit per sample, serve's limits (issues 52, 53) -----

sabotage "a checkpoint's manifest never read back" agentgym/policy/integrity.py \
    "    for name, want in files.items():" "    for name, want in list(files.items())[:0]:" \
    tests/test_attacks_checkpoints.py::test_weights_overwritten_with_nan_are_refused_at_resume_naming_the_file

sabotage "re-tokenised ids counted as none" agentgym/rollout/samples.py \
    '    ep.counts["tokens_resampled"] = float(sum(differ))' \
    '    ep.counts["tokens_resampled"] = 0.0' \
    tests/test_history_rewriting.py::test_a_sample_whose_ids_are_not_the_sampled_ones_is_an_error_naming_episode_and_turn

sabotage "a split sample's own turn credit dropped" agentgym/learn/advantages.py \
    "    if own is None:" "    if True:" \
    tests/test_turn_credit.py::test_turn_credit_reaches_each_sample_of_an_episode_whose_history_was_rewritten

sabotage "serve computing a prompt past the model's context" agentgym/serve/service.py \
    "        if room < 1 or (asked and params.max_new_tokens > room):" "        if False:" \
    tests/test_attacks_serve.py::test_a_prompt_past_the_models_context_is_refused_naming_both_numbers

planted=${#names[@]}
for ((k = 0; k < WORKERS && k < planted; k++)); do
    worker "$k" &
done
wait
missed_names=()
for i in "${!names[@]}"; do
    cat "$work/$i.out" 2>/dev/null || echo "sabotage: ${names[$i]}: NOT run (its worker ended first)"
    if [ -f "$work/$i.missed" ]; then missed_names+=("$(cat "$work/$i.missed")")
    elif [ ! -f "$work/$i.out" ]; then missed_names+=("${names[$i]}: not run"); fi
done
missed=${#missed_names[@]}
if [ "$missed" -gt 0 ]; then
    # repeated last, where a log cut to its tail (CI's) still shows them
    printf 'sabotage: NOT caught: %s\n' "${missed_names[@]}"
    echo "sabotage: $missed of $planted planted bug(s) not caught by their tests"
    exit 1
fi
echo "sabotage: every planted bug ($planted) was caught by its test"
