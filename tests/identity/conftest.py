"""Fixtures: both data-plane processes in a row over real sockets (`harness.identity_plane`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from harness.identity_plane import Cleanups, MakePlane, Plane, start_plane


@pytest.fixture
async def make_plane() -> AsyncIterator[MakePlane]:
    cleanups: Cleanups = []

    async def make(**isolation: object) -> Plane:
        return await start_plane(cleanups, **isolation)

    try:
        yield make
    finally:
        for cleanup in reversed(cleanups):
            await cleanup()
