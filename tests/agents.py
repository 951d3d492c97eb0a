"""Agent programs the tests train and evaluate (`run.agent: agents:<name>`)."""

from __future__ import annotations

import asyncio
import contextlib
import json


async def tool_loop(client, task):
    """The docs' agent: a tool loop over the task's tools."""
    messages = list(task.messages)
    for _ in range(6):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=task.tools or None
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = await task.call_tool(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages


async def keeps_calling(client, task):
    """The tool loop, for 9 turns whatever the env's turn limit."""
    messages = list(task.messages)
    for _ in range(9):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=task.tools or None
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            result = await task.call_tool(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages


async def summarising(client, task):
    """Asks twice, then rewrites its history as a summary and asks again: two samples."""
    messages = list(task.messages)
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "Go on."}]
    summary = [*task.messages[:-1], {"role": "user", "content": "So far: two tries. Answer."}]
    reply = await client.chat.completions.create(model="policy", messages=summary)
    return [*summary, reply.choices[0].message.model_dump(exclude_none=True)]


async def scores_itself(client, task):
    """Asks once and returns its own reward: 1.0 when the reply is non-empty."""
    reply = await client.chat.completions.create(model="policy", messages=task.messages)
    return 1.0 if reply.choices[0].message.content else 0.0


async def raises(client, task):
    await client.chat.completions.create(model="policy", messages=task.messages)
    raise RuntimeError("the agent's own bug")


async def hangs(client, task):
    await client.chat.completions.create(model="policy", messages=task.messages)
    await asyncio.sleep(3600)


async def sends_garbage(client, task):
    """Sends a request no server takes, gives up on the error, and returns a string."""
    with contextlib.suppress(Exception):  # the 400
        await client.chat.completions.create(model="policy", messages=[{"role": "robot"}])
    return "not a reward"


async def silent(client, task):
    """Returns messages without asking the model anything."""
    return list(task.messages)


def not_async(client, task):
    return 1.0


async def as_the_rollout(client, task):
    """Answers each turn with the environment's own reply, as the built-in rollout does."""
    messages = list(task.messages)
    while True:
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=task.tools or None
        )
        message = reply.choices[0].message.model_dump(exclude_none=True)
        replies, done = await task.env_step(message, reply.choices[0].finish_reason)
        messages += [message, *replies]
        if done:
            return messages


# -- attacks (tests/test_attacks_agents.py) ----------------------------------------------


async def blocks(client, task):
    """Asks once, then blocks its thread (no await): nothing can cancel it."""
    import time

    await client.chat.completions.create(model="policy", messages=task.messages)
    time.sleep(3600)


async def ignores_cancellation(client, task):
    """Asks once, then swallows every cancellation and waits on."""
    await client.chat.completions.create(model="policy", messages=task.messages)
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


async def exits(client, task):
    """Asks once, then raises SystemExit, as `sys.exit(3)` in agent code does."""
    await client.chat.completions.create(model="policy", messages=task.messages)
    raise SystemExit(3)


async def interrupts(client, task):
    await client.chat.completions.create(model="policy", messages=task.messages)
    raise KeyboardInterrupt


async def leaves_a_thread(client, task):
    """Asks once, starts a thread that is not a daemon and outlives the run, returns 1.0."""
    import threading
    import time

    await client.chat.completions.create(model="policy", messages=task.messages)
    threading.Thread(target=time.sleep, args=(3600,), name="agents-leftover", daemon=False).start()
    return 1.0


SEEN: dict[str, list] = {"urls": [], "answers": []}
"""What `calls_another_episode` saw: the episodes' URLs, and the answers to its tries."""


async def calls_another_episode(client, task):
    """Asks once on its own path; the second episode of a group then sends a request to the
    first's URL (which the first put in a module global): with its own key, with none, and
    with a made-up one. Notes each answer."""
    import openai

    await client.chat.completions.create(model="policy", messages=task.messages)
    own = str(client.base_url)
    SEEN["urls"].append(own)
    while len(SEEN["urls"]) < 2:  # both episodes have asked once
        await asyncio.sleep(0.05)
    if own == SEEN["urls"][0]:
        await asyncio.sleep(1.0)  # open while the other tries
        return 1.0
    for key in (client.api_key, "none", "x" * 43):
        other = openai.AsyncOpenAI(base_url=SEEN["urls"][0], api_key=key, max_retries=0)
        try:
            await other.chat.completions.create(model="policy", messages=task.messages)
            SEEN["answers"].append(200)
        except openai.APIStatusError as err:
            SEEN["answers"].append(err.status_code)
        finally:
            await other.close()
    return 1.0
