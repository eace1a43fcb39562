"""mount_webui and the `--ui` flag, without a model or a browser: what is served, with which headers, and that
every file the page loads ships in the package."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from wick.cli.main import build_parser
from wick.entrypoints.webui import STATIC_DIR, mount_webui


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    mount_webui(app)
    return TestClient(app)


def test_index_is_served_at_root_with_a_strict_policy(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert '<script type="module" src="/ui/app.js">' in response.text


def test_static_files_are_served_under_ui(client: TestClient) -> None:
    response = client.get("/ui/app.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/style.css").headers["content-type"].startswith("text/css")
    assert client.get("/ui/missing.js").status_code == 404


def test_everything_the_page_loads_is_in_the_package() -> None:
    html = (STATIC_DIR / "index.html").read_text()
    wanted = {path.removeprefix("/ui/") for path in re.findall(r'(?:src|href)="(/ui/[^"]+)"', html)}
    for module in STATIC_DIR.glob("*.js"):
        wanted |= {path.removeprefix("./") for path in re.findall(r'from "(\./[^"]+)"', module.read_text())}
    assert {"app.js", "style.css", "api.js", "markdown.js", "store.js", "vendor/marked/marked.esm.js"} <= wanted
    missing = sorted(path for path in wanted if not (STATIC_DIR / path).is_file())
    assert missing == []
    for library in ("marked", "highlight"):
        assert (STATIC_DIR / "vendor" / library / "LICENSE").is_file()


def test_ui_flag_and_its_candle_vllm_alias() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "--ui"]).ui
    assert parser.parse_args(["serve", "--ui-server"]).ui
    assert not parser.parse_args(["serve"]).ui
