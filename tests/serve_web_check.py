#!/usr/bin/env python3
"""serve_web_check.py — tests/test_serve_web.sh's checks of `mmc serve`'s chat page (GET /,
src/serve/web/chat.html) in a headless Debian chromium driven by Playwright: the page loads with
no console error (so nothing broke the Content-Security-Policy), shows the model id from
/v1/models once the API key is typed, sends a message with an image attached by the file input
(temperature 0; a pasted image is checked too) and renders the streamed answer equal to `mmc generate --greedy`'s text (exact
string equality) with finish_reason length; a second turn sends the whole history (3 messages);
during a long greedy generation (max_tokens 2000) streamed text shows before the end, then Stop
cuts it (12 other clients keep the engine busy meanwhile): the page shows a prefix of the full
answer, and /metrics counts fewer than 2000 completion tokens for it and no running sequence
once the others are done. Saves a screenshot.
Usage: serve_web_check.py PORT API_KEY MODEL_ID IMAGE EXPECTED_TEXT SCREENSHOT"""
import base64, json, sys, threading, time, urllib.request

from playwright.sync_api import sync_playwright

PORT, KEY, MODEL, IMG, EXPECTED, SHOT = sys.argv[1:7]
base = "http://127.0.0.1:%s" % PORT
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what, file=sys.stderr)


def metric(name):
    r = urllib.request.Request(base + "/metrics", headers={"Authorization": "Bearer " + KEY})
    for line in urllib.request.urlopen(r, timeout=30).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def last_assistant(page):
    return page.locator(".msg.assistant").last


def wait_finished(page, timeout=60000):
    page.wait_for_function("() => { const a = document.querySelectorAll('.msg.assistant');"
                           " return a.length && a[a.length - 1].dataset.finish; }", timeout=timeout)
    a = last_assistant(page)
    return a.get_attribute("data-finish"), a.text_content()


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    console = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(str(e)))
    bodies = []
    page.on("request", lambda r: bodies.append(r.post_data) if r.url.endswith("/v1/chat/completions") else None)

    resp = page.goto(base + "/")
    check(resp.status == 200 and resp.headers.get("content-type", "").startswith("text/html"),
          "GET / %s %s" % (resp.status, resp.headers))
    page.fill("#key", KEY)
    page.dispatch_event("#key", "change")
    page.wait_for_function("(m) => document.getElementById('model').textContent === m", arg=MODEL, timeout=10000)
    n_console = len(console)   # the first /v1/models, sent before the key was typed, is a 401

    # turn 1: an image by the file input, greedy, 8 tokens; count the answer's DOM updates
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "8")
    page.set_input_files("#file", IMG)
    page.wait_for_selector("#attachments img")
    page.fill("#prompt", "What colour is the square?")
    page.click("#send")
    finish, text = wait_finished(page)
    check(finish == "length" and text == EXPECTED, "turn 1: %r (%s) != mmc generate's %r" % (text, finish, EXPECTED))
    b = json.loads(bodies[-1])
    parts = b["messages"][0]["content"]
    check(b["stream"] is True and b["temperature"] == 0 and b["max_tokens"] == 8 and b["model"] == MODEL and
          parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith("data:image/png;base64,") and
          parts[1] == {"type": "text", "text": "What colour is the square?"}, "turn 1 request %s" % str(b)[:300])

    # turn 2: an image pasted into the message box shows as an attachment (a click removes it);
    # the history goes with the request
    with open(IMG, "rb") as f:
        png = base64.b64encode(f.read()).decode()
    page.evaluate("""(b64) => { const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const dt = new DataTransfer(); dt.items.add(new File([bytes], 'p.png', {type: 'image/png'}));
        document.getElementById('prompt').dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt})); }""", png)
    page.wait_for_selector("#attachments img")
    check(page.get_attribute("#attachments img", "src") == "data:image/png;base64," + png, "pasted image data URI")
    page.click("#attachments img")
    check(page.locator("#attachments img").count() == 0, "a click did not remove the attachment")
    page.fill("#prompt", "And the circle?")
    page.press("#prompt", "Enter")
    finish, text2 = wait_finished(page)
    b = json.loads(bodies[-1])
    check(finish == "length" and len(text2) > 0, "turn 2: %r %s" % (text2, finish))
    check([m["role"] for m in b["messages"]] == ["user", "assistant", "user"] and
          b["messages"][1]["content"] == EXPECTED, "turn 2 history %s" % str(b["messages"])[:300])
    page.screenshot(path=SHOT)

    # Stop: a long greedy generation; streamed text shows up before its end, then Stop
    story = [{"role": "user", "content": "Tell me a long story."}]
    r = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(
        {"messages": story, "temperature": 0, "top_p": 1, "max_tokens": 2000}).encode(),
        headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    full = json.load(urllib.request.urlopen(r, timeout=60))["choices"][0]["message"]["content"]
    page.click("#clear")
    page.fill("#max_tokens", "2000")
    before = metric("mmc_completion_tokens_total")
    # 12 other clients keep the engine busy (batched decode: ~6 s for 2000 tokens on 2 cores
    # instead of ~0.4 s alone), so Stop reaches the server while the page's sequence still runs
    load_tokens = []

    def load(i):
        body = {"messages": [{"role": "user", "content": "Story %d" % i}], "max_tokens": 2000, "temperature": 1.0,
                "seed": i}
        q = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                   headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        load_tokens.append(json.load(urllib.request.urlopen(q, timeout=120))["usage"]["completion_tokens"])

    threads = [threading.Thread(target=load, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    page.fill("#prompt", story[0]["content"])
    page.click("#send")
    page.wait_for_function("() => { const a = document.querySelector('.msg.assistant');"
                           " return a && a.textContent.length > 0 && !a.dataset.finish; }", polling=5, timeout=30000)
    page.click("#stop")
    finish, text3 = wait_finished(page)
    check(finish == "stopped", "Stop: the stream was not cut (finish %s, %d chars)" % (finish, len(text3)))
    # a prefix, not always a strict one: the random model's greedy 2000 tokens are 501 chars, its later
    # tokens decode to nothing visible; that the generation was cut is /metrics' count below
    check(0 < len(text3) and full.startswith(text3),
          "Stop: the page shows %d chars, not a prefix of the %d-char answer" % (len(text3), len(full)))
    check(page.is_enabled("#send") and not page.is_enabled("#stop"), "Stop: buttons not reset")
    running_at_stop = metric("mmc_running_sequences")
    for t in threads:
        t.join()
    t0, running = time.time(), None
    while time.time() - t0 < 10:
        running = metric("mmc_running_sequences")
        if running == 0 and metric("mmc_queue_depth") == 0:
            break
        time.sleep(0.05)
    after = metric("mmc_completion_tokens_total") - sum(load_tokens)
    check(len(load_tokens) == 12 and running_at_stop is not None, "Stop: the load clients %s" % load_tokens)
    check(after - before < 2000, "Stop: the server generated all 2000 tokens (not cancelled)")
    check(running == 0, "Stop: the generation still runs (mmc_running_sequences %s)" % running)
    print("serve_web_check: Stop: the page shows %d of %d chars; the server generated %d of 2000 tokens"
          % (len(text3), len(full), after - before))
    check(not console[n_console:], "console errors: %s" % console[n_console:])
    check(all("401" in c for c in console[:n_console]), "console errors before the key: %s" % console[:n_console])
    browser.close()

print("serve_web_check: %d failures" % len(fails))
sys.exit(1 if fails else 0)
