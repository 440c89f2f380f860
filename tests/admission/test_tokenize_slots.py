"""Each tenant tokenizes at most TOKENIZE_PER_TENANT prompts at once; other tenants do not wait on it."""

import asyncio

from gateway.admission.tokenize_slots import TokenizeSlots


async def test_a_tenants_third_prompt_waits_for_its_own_not_for_others() -> None:
    slots = TokenizeSlots(per_tenant=2)
    release = asyncio.Event()
    entered: list[str] = []

    async def tokenize(tenant: str) -> None:
        async with slots.hold(tenant):
            entered.append(tenant)
            await release.wait()

    tasks = [asyncio.create_task(tokenize(tenant)) for tenant in ("hostile", "hostile", "hostile", "victim")]
    await asyncio.sleep(0.05)
    assert sorted(entered) == ["hostile", "hostile", "victim"]
    release.set()
    await asyncio.gather(*tasks)
    assert entered.count("hostile") == 3
