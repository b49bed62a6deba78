"""Records the requests Open WebUI sends to sqe-gateway, for tests/fixtures/chat_clients.

Not part of the test suite (it needs Open WebUI, Chromium and Playwright, which CI does not
install): it is how the fixture was made, and how to make it again for a new Open WebUI.

  python3 -m venv /tmp/owui && /tmp/owui/bin/pip install open-webui==0.12.4 playwright
  apt-get install chromium
  # a database with demo/shop.sql, the extension, an authenticator role and a token (README,
  # "the gateway"), a model (scripts/local-llm.sh, or the scripted one:
  # target/debug/scripted_llm ANSWERS.json), and the gateway on 127.0.0.1:8085
  /tmp/owui/bin/python tests/clients/record_openwebui.py proxy http://127.0.0.1:8085 8086 requests.jsonl &
  DATA_DIR=/tmp/owui-data OFFLINE_MODE=true ENABLE_OLLAMA_API=false \
      OPENAI_API_BASE_URL=http://127.0.0.1:8086/v1 OPENAI_API_KEY=TOKEN \
      /tmp/owui/bin/open-webui serve --host 127.0.0.1 --port 8081 &
  /tmp/owui/bin/python tests/clients/record_openwebui.py drive http://127.0.0.1:8081 requests.jsonl
  /tmp/owui/bin/python tests/clients/record_openwebui.py fixture requests.jsonl OUT.json

`drive` signs up the first (admin) user and, in Chromium as a user would: asks a question, a
follow-up, regenerates the follow-up's answer, edits the first question, then starts a second
chat with the same first question and a follow-up. It marks each step in the log.
"""

import asyncio
import json
import sys
import time


def proxy(upstream, port, log):
    """Every request is appended to `log` (Authorization left out) and forwarded."""
    from aiohttp import ClientSession, ClientTimeout, web

    async def handle(request):
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        record = {"at": time.time(), "method": request.method, "path": request.path_qs,
                  "headers": {k: v for k, v in headers.items() if k.lower() != "authorization"}}
        try:
            record["body"] = json.loads(body) if body else None
        except ValueError:
            record["body_text"] = body.decode("utf-8", "replace")
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
        async with ClientSession(timeout=ClientTimeout(total=300)) as session:
            async with session.request(request.method, upstream + request.path_qs,
                                       headers=headers, data=body) as up:
                response = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() in ("content-type", "cache-control")})
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(port), print=None)


async def drive(base, log):
    from playwright.async_api import async_playwright

    def mark(name):
        with open(log, "a") as f:
            f.write(json.dumps({"marker": name}) + "\n")

    async def dismiss(page):
        for _ in range(3):
            if await page.locator("div[role=dialog]").count() == 0:
                return
            await page.keyboard.press("Escape")
            await page.wait_for_timeout(700)

    async def ask(page, text):
        await dismiss(page)
        await page.locator("#chat-input").click()
        await page.keyboard.type(text)
        await page.keyboard.press("Enter")

    async def answered(page):
        await page.wait_for_function(
            "document.querySelectorAll('button[aria-label=\"Regenerate\"]').length >= 1", timeout=60000)
        await page.wait_for_timeout(4000)  # the title, tags and follow-up tasks run after it

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
        await page.goto(base + "/")
        await page.get_by_text("Get started").click()
        await page.get_by_placeholder("Enter Your Full Name").fill("Ada Analyst")
        await page.get_by_placeholder("Enter Your Email").fill("ada@example.com")
        await page.get_by_placeholder("Enter Your Password").fill("a-long-password-1")
        await page.get_by_text("Create Admin Account").click()
        await page.wait_for_timeout(5000)
        await dismiss(page)
        mark("chat A: first question")
        await ask(page, "How many customers are there?")
        await answered(page)
        mark("chat A: follow-up")
        await ask(page, "And how many of them are from Germany?")
        await answered(page)
        mark("chat A: regenerate the follow-up's answer")
        regenerate = page.locator('button[aria-label="Regenerate"]').last
        await regenerate.hover()
        await regenerate.click()
        await page.get_by_text("Try Again").click()
        await page.wait_for_timeout(8000)
        mark("chat A: edit the first question")
        first = page.locator("text=How many customers are there?").last
        await first.scroll_into_view_if_needed()
        await first.hover()
        await page.locator('button[aria-label="Edit"]').first.click()
        await page.locator("textarea").first.fill("How many products are there?")
        await page.get_by_role("button", name="Send").click()
        await page.wait_for_timeout(8000)
        mark("chat B: a new chat that starts like chat A")
        await page.goto(base + "/")
        await page.wait_for_timeout(3000)
        await ask(page, "How many customers are there?")
        await answered(page)
        mark("chat B: follow-up")
        await ask(page, "Which products have never been ordered?")
        await answered(page)
        mark("end")
        await browser.close()


def fixture(log, out, client="Open WebUI 0.12.4"):
    """The POSTs of `log`, each with the step it belongs to."""
    steps, step = [], None
    for line in open(log):
        record = json.loads(line)
        if "marker" in record:
            step = record["marker"]
        elif record["method"] == "POST":
            keep = ("user-agent", "content-type", "accept")
            steps.append({"step": step, "body": record["body"],
                          "headers": {k: v for k, v in record["headers"].items() if k.lower() in keep}})
    json.dump({"client": client, "recorded": time.strftime("%Y-%m-%d"),
               "how": "tests/clients/record_openwebui.py", "requests": steps}, open(out, "w"), indent=1)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "proxy":
        proxy(*args)
    elif command == "drive":
        asyncio.run(drive(*args))
    elif command == "fixture":
        fixture(*args)
    else:
        sys.exit(__doc__)
