"""Files: uploaded bytes, Uploads, composition, downloads and signed links."""
