"""The running test stack as the tests see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import openai

from nightbatch.files.assembly import ThreadUploadJobs
from nightbatch.settings import Settings
from nightbatch.wiring import Services

API_KEY = "sk-uploads-test"
MiB = 1024 * 1024


@dataclass
class Stack:
    base_url: str
    aws_endpoint: str
    services: Services
    settings: Settings

    @property
    def jobs(self) -> ThreadUploadJobs:
        jobs = self.services.assembly.jobs
        assert isinstance(jobs, ThreadUploadJobs)
        return jobs

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=API_KEY, max_retries=0, **kw)

    def file_item(self, file_id: str) -> dict[str, Any]:
        item = self.services.adapters.table.get(file_id)
        assert item is not None
        return item

    def part_keys(self, upload_id: str) -> list[str]:
        return list(self.services.files.blobs.list_keys(f"uploads/{upload_id}/"))
