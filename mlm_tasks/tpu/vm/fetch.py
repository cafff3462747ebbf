"""Copy one gs:// object to a local file with Python's standard library: how a TPU VM fetches the staged code
before anything of the project is there (bundle.py runs this file's source with the image's Python).

    python fetch.py gs://bucket/prefix/_code/<sha>/mlm_tasks.tar.gz mlm_tasks.tar.gz

The storage layer's rules (mlm_tasks/storage.py), without its packages: STORAGE_EMULATOR_HOST when set, else
the GCS JSON API as the VM's service account (a token from the metadata server). Importing TensorFlow for
this would cost seconds and, on a single-host PJRT runtime, load libtpu and take the TPU chips.
"""

import json
import os
import shutil
import sys
import urllib.parse
import urllib.request

TIMEOUT_S = 60  # each connect and read
TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"


def fetch(uri: str, dest: str) -> None:
    bucket, _, name = uri[len("gs://") :].partition("/")
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").rstrip("/")
    url = (
        f"{emulator or 'https://storage.googleapis.com'}/download/storage/v1/b/{bucket}/o/"
        f"{urllib.parse.quote(name, safe='')}?alt=media"
    )
    headers = {}
    if not emulator:
        ask = urllib.request.Request(TOKEN, headers={"Metadata-Flavor": "Google"})
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the metadata server is local
        with no_proxy.open(ask, timeout=TIMEOUT_S) as answer:
            headers["Authorization"] = "Bearer " + json.load(answer)["access_token"]
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer, open(dest, "wb") as out:
        shutil.copyfileobj(answer, out)


if __name__ == "__main__":
    fetch(sys.argv[1], sys.argv[2])
