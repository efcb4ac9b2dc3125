"""KMS adapter: seals short secrets (webhook signing secrets) with the stack's key, bound to the item they live in.

A sealed value is `kms:` + base64 ciphertext; the encryption context names the item, so a value copied to
another item does not open. Table read access alone no longer reveals a secret: decrypting needs kms:Decrypt.
"""

from __future__ import annotations

import base64
from typing import Any

PREFIX = "kms:"


class KmsSealer:
    def __init__(self, *, client: Any, key_id: str) -> None:
        self.client = client
        self.key_id = key_id

    def seal(self, plaintext: str, context: str) -> str:
        blob = self.client.encrypt(KeyId=self.key_id, Plaintext=plaintext.encode(),
                                   EncryptionContext={"nightbatch": context})["CiphertextBlob"]
        return PREFIX + base64.b64encode(blob).decode()

    def open(self, value: str, context: str) -> str:
        if not value.startswith(PREFIX):
            return value  # stored before sealing was configured
        blob = base64.b64decode(value[len(PREFIX):])
        plaintext: bytes = self.client.decrypt(CiphertextBlob=blob, EncryptionContext={"nightbatch": context})[
            "Plaintext"]
        return plaintext.decode()
