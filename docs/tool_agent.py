"""An agent program written against the plain `openai` client: a tool loop over the task's
tools. `agentgym train --env tool_call --agent docs/tool_agent.py:agent` trains it."""

import json


async def agent(client, task):
    messages = list(task.messages)
    for _ in range(6):  # turns
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=task.tools or None
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break  # an answer: the environment's judge scores the conversation
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = await task.call_tool(call.function.name, arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages
