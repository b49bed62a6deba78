"""The gateway as real clients see it: the official OpenAI Python SDK and the official MCP Python
SDK (streamable HTTP and stdio). Run by tests/tests/gateway.rs, which starts the cluster, the
scripted model and the gateway, and passes their coordinates on the command line. Exits non-zero
(with the failed assertion) when the gateway does not behave.
"""

import argparse
import asyncio
import json

import openai
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="the gateway's base URL")
    p.add_argument("--model", required=True)
    p.add_argument("--token", required=True, help="a token of the reader role")
    p.add_argument("--limited-token", required=True, help="a token of a role that may not read orders")
    p.add_argument("--gateway", required=True, help="the sqe-gateway binary, for MCP over stdio")
    p.add_argument("--database-url", required=True)
    p.add_argument("--role", required=True)
    return p.parse_args()


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def openai_sdk(args):
    client = openai.OpenAI(base_url=f"{args.base}/v1", api_key=args.token)
    models = [m.id for m in client.models.list().data]
    check(models == [args.model], f"models: {models}")

    answer = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "How many orders are there?"}]
    )
    text = answer.choices[0].message.content
    check("```sql\nSELECT count(*) AS n FROM orders\n```" in text, text)
    check("| n |" in text and "| 6 |" in text, text)
    check(answer.usage.prompt_tokens > 0 and answer.usage.total_tokens > answer.usage.prompt_tokens, answer.usage)

    # Streamed: progress first (as reasoning), then the answer.
    reasoning, content = [], []
    for chunk in client.chat.completions.create(
        model=args.model,
        stream=True,
        messages=[{"role": "user", "content": "Which customers are from Germany?"}],
        extra_body={"chat_id": "sdk-chat-1"},
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        extra = getattr(delta, "model_extra", None) or {}
        if extra.get("reasoning_content"):
            reasoning.append(extra["reasoning_content"])
        if delta.content:
            content.append(delta.content)
    check(any("schema ready" in r for r in reasoning), f"no progress in the stream: {reasoning}")
    check(any("done: ok" in r for r in reasoning), reasoning)
    text = "".join(content)
    check("| Bruno |" in text and "| Dmitri |" in text, text)
    # a follow-up in the same chat (the gateway checks that the model saw the first turn)
    client.chat.completions.create(
        model=args.model,
        messages=[
            {"role": "user", "content": "Which customers are from Germany?"},
            {"role": "assistant", "content": text},
            {"role": "user", "content": "And how many of them are there?"},
        ],
        extra_body={"chat_id": "sdk-chat-1"},
    )

    # Errors are errors, with their HTTP status.
    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        check(False, "an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.code == "model_not_found", e)
    try:
        openai.OpenAI(base_url=f"{args.base}/v1", api_key="not-a-token-of-ours").models.list()
        check(False, "an unknown token was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, e)
    try:
        client.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Delete every order"}])
        check(False, "a write was answered")
    except openai.PermissionDeniedError as e:
        check(e.status_code == 403 and e.code == "25006", e)

    # A role that may not read orders gets no data from it.
    limited = openai.OpenAI(base_url=f"{args.base}/v1", api_key=args.limited_token)
    try:
        answer = limited.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": "How many orders are there?"}]
        )
        check("| 6 |" not in answer.choices[0].message.content, answer)
    except openai.APIStatusError as e:
        check(e.status_code in (403, 422), e)
        check("orders" in str(e), e)


async def mcp_session(session, expect_rows=True):
    info = await session.initialize()
    check(info.server_info.name == "sqe-gateway", info)
    tools = {t.name: t for t in (await session.list_tools()).tools}
    check(set(tools) == {"ask", "generate_sql", "check_sql", "run_sql", "fix_sql", "describe_schema",
                         "give_feedback"}, tools)
    check(all(t.annotations and t.annotations.read_only_hint for n, t in tools.items() if n != "give_feedback"),
          tools)
    check(tools["give_feedback"].annotations.read_only_hint is False, tools["give_feedback"])

    result = await session.call_tool("ask", {"question": "How many orders are there?"})
    check(not result.is_error, result)
    answer = json.loads(result.content[0].text)
    check(answer["sql"] == "SELECT count(*) AS n FROM orders" and answer["rows"] == [[6]], answer)
    # A thumbs-up: the role may not write examples, so it waits for review.
    result = await session.call_tool("give_feedback", {"history_id": answer["history_id"], "correct": True})
    check(not result.is_error, result)
    given = json.loads(result.content[0].text)
    check(given["status"] == "pending" and given["example_id"] is None, given)

    # Multi-statement injection goes through the guard like everything else.
    result = await session.call_tool("run_sql", {"sql": "COMMIT; DELETE FROM orders"})
    check(result.is_error and "25006" in result.content[0].text, result)
    result = await session.call_tool("run_sql", {"sql": "SELECT count(*) AS n FROM orders"})
    check(json.loads(result.content[0].text)["rows"] == [{"n": 6}], result)
    result = await session.call_tool("check_sql", {"sql": "SELECT pg_sleep(1)"})
    check(result.is_error and "42501" in result.content[0].text, result)
    # Checking runs no code: a literal of an array of a domain whose CHECK runs SQL is refused
    # before the CHECK runs (the test looks for the row it would have written).
    result = await session.call_tool(
        "check_sql", {"sql": """SELECT '{"INSERT INTO shared.log VALUES (1)"}'::shared.sqltext[]"""}
    )
    check(result.is_error and "42501" in result.content[0].text, result)
    result = await session.call_tool("fix_sql", {"sql": "SELECT nme FROM customers"})
    check(json.loads(result.content[0].text)["sql"] == "SELECT name FROM customers", result)

    resources = [str(r.uri) for r in (await session.list_resources()).resources]
    check("sqe://tables" in resources, resources)
    tables = json.loads((await session.read_resource("sqe://tables")).contents[0].text)
    names = {t["name"] for t in tables}
    check({"customers", "orders"} <= names and "secrets" not in names, tables)
    # Relations of schemas the role may not use are left out; comments are cut.
    check("plans" not in names, names)
    notes = [t for t in tables if t["name"] == "notes"]
    check(len(notes) == 1 and 0 < len(notes[0]["comment"]) <= 1000, [len(t["comment"] or "") for t in notes])


async def mcp_http(args):
    headers = {"Authorization": f"Bearer {args.token}"}
    async with streamable_http_client(f"{args.base}/mcp", http_client=create_mcp_http_client(headers=headers)) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await mcp_session(session)


async def mcp_stdio(args):
    server = StdioServerParameters(
        command=args.gateway, args=["mcp-stdio", "--database-url", args.database_url, "--role", args.role]
    )
    async with stdio_client(server) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await mcp_session(session)


def main():
    args = parse_args()
    openai_sdk(args)
    print("openai: ok")
    asyncio.run(mcp_http(args))
    print("mcp over streamable HTTP: ok")
    asyncio.run(mcp_stdio(args))
    print("mcp over stdio: ok")


if __name__ == "__main__":
    main()
