"""The project's images, built from the `Dockerfile` with podman on this machine (`scripts/images`).

Why here and not in CI only: the images a user pulls must be built and run by every test
run, or a broken entrypoint reaches the first install unnoticed. This machine has no
registry but PyPI and Debian's archive, so the base image is made with `mmdebstrap` and
handed to the Dockerfile as `PYTHON_IMAGE`; everything else is the Dockerfile as released.

Modules, one job each:

- `host`: the machine: installs podman and friends with apt, writes the `containers.conf`
  podman needs here (runtime, ulimits), runs podman, prints progress;
- `base`: the Debian base image from `mmdebstrap`, cached by its inputs;
- `build`: every image target, cached by its inputs, built under a temporary tag and
  tagged only on success; OCI archives and pushes.

Stdlib only: it runs before (and without) the project's environment. The tests reach the
images through `ensure_images`.
"""

from tools.images.build import TARGETS, Built, ensure_images
from tools.images.host import ImagesError, podman_env

__all__ = ["TARGETS", "Built", "ImagesError", "ensure_images", "podman_env"]
