"""What an AWS call raises for AWS's or the network's reasons: its own module, so importing the storage package
does not load botocore (the API's cold import defers it)."""

from botocore.exceptions import BotoCoreError, ClientError

# Throttling, 5xx, a timeout, a refused call: worth retrying later, unlike an error in the code or the data.
AWS_ERRORS: tuple[type[Exception], ...] = (BotoCoreError, ClientError, OSError)
