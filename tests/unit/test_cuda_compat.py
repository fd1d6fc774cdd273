"""Whether an image's CUDA runs on a node's driver. The requirement strings are the
NVIDIA_REQUIRE_CUDA of NVIDIA's own nvidia/cuda base images (the x86_64 stage of
gitlab.com/nvidia/container-images/cuda dist/12.8.1/ubuntu2404/base/Dockerfile,
dist/13.0.0/ubuntu2404/base/Dockerfile and dist/12.4.1/ubuntu2204/base/Dockerfile); the
driver numbers are NVIDIA's release-note tables, and the driver versions are real releases
(570.133.20, 535.230.02, 545.23.08, 550.54.14, 470.256.02, 575.57.08)."""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.image import (
    MINOR_COMPAT_DRIVER,
    TOOLKIT_DRIVER,
    Verdict,
    driver_cuda,
    judge,
    parse_version,
    requirement_met,
)

REQUIRE_12_8_1 = (
    "cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=grid,driver>=470,driver<471 "
    "brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 "
    "brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 "
    "brand=nvidiartx,driver>=470,driver<471 brand=vapps,driver>=470,driver<471 "
    "brand=vpc,driver>=470,driver<471 brand=vcs,driver>=470,driver<471 "
    "brand=vws,driver>=470,driver<471 brand=cloudgaming,driver>=470,driver<471 "
    "brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536 "
    "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536 "
    "brand=quadro,driver>=535,driver<536 brand=quadrortx,driver>=535,driver<536 "
    "brand=nvidiartx,driver>=535,driver<536 brand=vapps,driver>=535,driver<536 "
    "brand=vpc,driver>=535,driver<536 brand=vcs,driver>=535,driver<536 "
    "brand=vws,driver>=535,driver<536 brand=cloudgaming,driver>=535,driver<536 "
    "brand=unknown,driver>=550,driver<551 brand=grid,driver>=550,driver<551 "
    "brand=tesla,driver>=550,driver<551 brand=nvidia,driver>=550,driver<551 "
    "brand=quadro,driver>=550,driver<551 brand=quadrortx,driver>=550,driver<551 "
    "brand=nvidiartx,driver>=550,driver<551 brand=vapps,driver>=550,driver<551 "
    "brand=vpc,driver>=550,driver<551 brand=vcs,driver>=550,driver<551 "
    "brand=vws,driver>=550,driver<551 brand=cloudgaming,driver>=550,driver<551 "
    "brand=unknown,driver>=560,driver<561 brand=grid,driver>=560,driver<561 "
    "brand=tesla,driver>=560,driver<561 brand=nvidia,driver>=560,driver<561 "
    "brand=quadro,driver>=560,driver<561 brand=quadrortx,driver>=560,driver<561 "
    "brand=nvidiartx,driver>=560,driver<561 brand=vapps,driver>=560,driver<561 "
    "brand=vpc,driver>=560,driver<561 brand=vcs,driver>=560,driver<561 "
    "brand=vws,driver>=560,driver<561 brand=cloudgaming,driver>=560,driver<561 "
    "brand=unknown,driver>=565,driver<566 brand=grid,driver>=565,driver<566 "
    "brand=tesla,driver>=565,driver<566 brand=nvidia,driver>=565,driver<566 "
    "brand=quadro,driver>=565,driver<566 brand=quadrortx,driver>=565,driver<566 "
    "brand=nvidiartx,driver>=565,driver<566 brand=vapps,driver>=565,driver<566 "
    "brand=vpc,driver>=565,driver<566 brand=vcs,driver>=565,driver<566 "
    "brand=vws,driver>=565,driver<566 brand=cloudgaming,driver>=565,driver<566"
)
REQUIRE_13_0_0 = (
    "cuda>=13.0 brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536 "
    "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536 "
    "brand=quadro,driver>=535,driver<536 brand=quadrortx,driver>=535,driver<536 "
    "brand=nvidiartx,driver>=535,driver<536 brand=vapps,driver>=535,driver<536 "
    "brand=vpc,driver>=535,driver<536 brand=vcs,driver>=535,driver<536 "
    "brand=vws,driver>=535,driver<536 brand=cloudgaming,driver>=535,driver<536 "
    "brand=unknown,driver>=550,driver<551 brand=grid,driver>=550,driver<551 "
    "brand=tesla,driver>=550,driver<551 brand=nvidia,driver>=550,driver<551 "
    "brand=quadro,driver>=550,driver<551 brand=quadrortx,driver>=550,driver<551 "
    "brand=nvidiartx,driver>=550,driver<551 brand=vapps,driver>=550,driver<551 "
    "brand=vpc,driver>=550,driver<551 brand=vcs,driver>=550,driver<551 "
    "brand=vws,driver>=550,driver<551 brand=cloudgaming,driver>=550,driver<551 "
    "brand=unknown,driver>=565,driver<566 brand=grid,driver>=565,driver<566 "
    "brand=tesla,driver>=565,driver<566 brand=nvidia,driver>=565,driver<566 "
    "brand=quadro,driver>=565,driver<566 brand=quadrortx,driver>=565,driver<566 "
    "brand=nvidiartx,driver>=565,driver<566 brand=vapps,driver>=565,driver<566 "
    "brand=vpc,driver>=565,driver<566 brand=vcs,driver>=565,driver<566 "
    "brand=vws,driver>=565,driver<566 brand=cloudgaming,driver>=565,driver<566 "
    "brand=unknown,driver>=570,driver<571 brand=grid,driver>=570,driver<571 "
    "brand=tesla,driver>=570,driver<571 brand=nvidia,driver>=570,driver<571 "
    "brand=quadro,driver>=570,driver<571 brand=quadrortx,driver>=570,driver<571 "
    "brand=nvidiartx,driver>=570,driver<571 brand=vapps,driver>=570,driver<571 "
    "brand=vpc,driver>=570,driver<571 brand=vcs,driver>=570,driver<571 "
    "brand=vws,driver>=570,driver<571 brand=cloudgaming,driver>=570,driver<571 "
    "brand=unknown,driver>=575,driver<576 brand=grid,driver>=575,driver<576 "
    "brand=tesla,driver>=575,driver<576 brand=nvidia,driver>=575,driver<576 "
    "brand=quadro,driver>=575,driver<576 brand=quadrortx,driver>=575,driver<576 "
    "brand=nvidiartx,driver>=575,driver<576 brand=vapps,driver>=575,driver<576 "
    "brand=vpc,driver>=575,driver<576 brand=vcs,driver>=575,driver<576 "
    "brand=vws,driver>=575,driver<576 brand=cloudgaming,driver>=575,driver<576"
)
REQUIRE_12_4_1 = (
    "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
    "brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 "
    "brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 "
    "brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 "
    "brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471 "
    "brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526 "
    "brand=nvidia,driver>=525,driver<526 brand=nvidiartx,driver>=525,driver<526 "
    "brand=geforce,driver>=525,driver<526 brand=geforcertx,driver>=525,driver<526 "
    "brand=quadro,driver>=525,driver<526 brand=quadrortx,driver>=525,driver<526 "
    "brand=titan,driver>=525,driver<526 brand=titanrtx,driver>=525,driver<526 "
    "brand=tesla,driver>=535,driver<536 brand=unknown,driver>=535,driver<536 "
    "brand=nvidia,driver>=535,driver<536 brand=nvidiartx,driver>=535,driver<536 "
    "brand=geforce,driver>=535,driver<536 brand=geforcertx,driver>=535,driver<536 "
    "brand=quadro,driver>=535,driver<536 brand=quadrortx,driver>=535,driver<536 "
    "brand=titan,driver>=535,driver<536 brand=titanrtx,driver>=535,driver<536"
)


def nvidia_image(require: str, cuda: str, driver: str, brand: str | None,
                 driver_cuda_version: str | None = None) -> Verdict:
    return judge(image_cuda=cuda, require=require, disable_require=False, driver=driver,
                 driver_cuda_version=driver_cuda_version, brand=brand,
                 image=f"image nvidia/cuda:{cuda}-base")


def test_the_real_requirements_have_the_shape_of_nvidia_images() -> None:
    for require, first, branches in ((REQUIRE_12_8_1, "cuda>=12.8", {470, 535, 550, 560, 565}),
                                     (REQUIRE_13_0_0, "cuda>=13.0", {535, 550, 565, 570, 575}),
                                     (REQUIRE_12_4_1, "cuda>=12.4", {470, 525, 535})):
        alternatives = require.split(" ")
        assert alternatives[0] == first
        assert {int(a.split(",")[1].removeprefix("driver>=")) for a in alternatives[1:]} \
            == branches
        assert all(a.startswith("brand=") and len(a.split(",")) == 3 for a in alternatives[1:])


def test_a_driver_new_enough_passes_on_the_cuda_term() -> None:
    verdict = nvidia_image(REQUIRE_12_8_1, "12.8.1", "570.133.20", "GeForce", "12.8")
    assert verdict.ok and verdict.rule == "requirement"
    assert "cuda>=12.8" in verdict.message and "570.133.20" in verdict.message
    newer = nvidia_image(REQUIRE_12_8_1, "12.8.1", "580.95.05", None, "13.0")
    assert newer.ok and newer.rule == "requirement"


def test_an_old_listed_branch_on_a_data_center_gpu_passes_by_forward_compatibility() -> None:
    verdict = nvidia_image(REQUIRE_12_8_1, "12.8.1", "535.230.02", "Tesla")
    assert verdict == Verdict(True, "forward compatibility", verdict.message)
    assert "brand=tesla,driver>=535,driver<536" in verdict.message
    assert "CUDA 12.2" in verdict.message and ">= 570.26" in verdict.message


def test_the_same_old_driver_on_a_geforce_fails() -> None:
    verdict = nvidia_image(REQUIRE_12_8_1, "12.8.1", "535.230.02", "GeForce")
    assert not verdict.ok and verdict.rule == "requirement"
    for part in ("cuda>=12.8", "535.230.02", "CUDA 12.2", "brand GeForce", ">= 570.26",
                 "refuses to start"):
        assert part in verdict.message
    # The 12.4.1 image still listed GeForce on the 535 branch; the 12.8.1 image dropped it.
    older = nvidia_image(REQUIRE_12_4_1, "12.4.1", "535.230.02", "GeForce")
    assert older.ok and older.rule == "forward compatibility"


def test_an_unknown_brand_meets_no_brand_alternative() -> None:
    assert not nvidia_image(REQUIRE_12_8_1, "12.8.1", "535.230.02", None).ok


def test_a_driver_on_no_listed_branch_fails_naming_the_versions() -> None:
    verdict = nvidia_image(REQUIRE_12_8_1, "12.8.1", "545.23.08", "Tesla")
    assert not verdict.ok
    assert verdict.message.startswith("image nvidia/cuda:12.8.1-base needs cuda>=12.8 "
                                      "(NVIDIA_REQUIRE_CUDA) but the node's driver 545.23.08 "
                                      "supports CUDA 12.3")
    assert "upgrade the driver to >= 570.26 or use an image built for CUDA 12.3" \
        in verdict.message


def test_cuda_version_alone_gets_the_toolkits_legacy_requirement() -> None:
    verdict = judge(image_cuda="12.9.1", require=None, disable_require=False,
                    driver="570.133.20", driver_cuda_version="12.8", image="image X")
    assert not verdict.ok and verdict.rule == "requirement"
    assert verdict.message.startswith(
        "image X needs cuda>=12.9 (from CUDA_VERSION 12.9.1) but the node's driver 570.133.20 "
        "supports CUDA 12.8: the container toolkit refuses to start it; upgrade the driver to "
        ">= 575.51.03 or use an image built for CUDA 12.8")
    assert judge(image_cuda="12.8.0", require=None, disable_require=False,
                 driver="570.133.20", driver_cuda_version=None).ok


def test_a_cuda_13_image_fails_on_a_570_driver() -> None:
    geforce = nvidia_image(REQUIRE_13_0_0, "13.0.0", "570.133.20", "GeForce")
    assert not geforce.ok
    assert "cuda>=13.0" in geforce.message and "CUDA 12.8" in geforce.message
    assert ">= 580.65.06" in geforce.message
    legacy = judge(image_cuda="13.0.0", require=None, disable_require=False,
                   driver="570.133.20", driver_cuda_version=None)
    assert not legacy.ok
    disabled = judge(image_cuda="13.0.0", require=REQUIRE_13_0_0, disable_require=True,
                     driver="570.133.20", driver_cuda_version=None)
    assert not disabled.ok and ">= 580.65.06" in disabled.message
    # NVIDIA's 13.0.0 image lists the R570 branch for data-center GPUs.
    tesla = nvidia_image(REQUIRE_13_0_0, "13.0.0", "570.133.20", "Tesla")
    assert tesla.ok and tesla.rule == "forward compatibility"


def test_minor_version_compatibility_when_the_requirement_is_disabled() -> None:
    verdict = judge(image_cuda="12.9.1", require=None, disable_require=True,
                    driver="550.54.14", driver_cuda_version="12.4")
    assert verdict.ok and verdict.rule == "minor version compatibility"
    assert "525.60.13" in verdict.message and "PTX" in verdict.message
    enforced = judge(image_cuda="12.9.1", require=None, disable_require=False,
                     driver="550.54.14", driver_cuda_version="12.4")
    assert not enforced.ok and "NVIDIA_DISABLE_REQUIRE" in enforced.message


def test_an_11_x_driver_cannot_run_a_12_x_image() -> None:
    verdict = judge(image_cuda="12.9.1", require=None, disable_require=True,
                    driver="470.256.02", driver_cuda_version=None)
    assert not verdict.ok
    for part in ("CUDA 12.9.1", "470.256.02", "CUDA 11.4", ">= 575.51.03", ">= 525.60.13"):
        assert part in verdict.message


def test_the_toolkit_driver_rule() -> None:
    verdict = judge(image_cuda="12.9.1", require=None, disable_require=True,
                    driver="575.57.08", driver_cuda_version=None)
    assert verdict.ok and verdict.rule == "toolkit driver"
    assert ">= 575.51.03" in verdict.message


def test_an_image_without_cuda() -> None:
    assert judge(image_cuda=None, require=None, disable_require=False, driver="570.133.20",
                 driver_cuda_version=None, image="image ubuntu:24.04") == Verdict(
        True, "none", "image ubuntu:24.04 declares no CUDA (CUDA_VERSION, NVIDIA_REQUIRE_CUDA)")


def test_the_toolkit_driver_table() -> None:
    releases = sorted(TOOLKIT_DRIVER)
    drivers = [parse_version(TOOLKIT_DRIVER[r]) for r in releases]
    assert drivers == sorted(drivers) and len(set(drivers)) == len(drivers)
    assert {(11, m) for m in range(9)} | {(12, m) for m in (0, 1, 2, 3, 4, 5, 6, 8, 9)} \
        | {(13, 0)} <= set(releases)
    assert (12, 7) not in TOOLKIT_DRIVER
    assert TOOLKIT_DRIVER[(12, 8)] == "570.26" and TOOLKIT_DRIVER[(13, 0)] == "580.65.06"
    assert TOOLKIT_DRIVER[(12, 4)] == "550.54.14" and TOOLKIT_DRIVER[(11, 8)] == "520.61.05"
    for release in releases:
        assert driver_cuda(TOOLKIT_DRIVER[release]) == release


def test_the_minor_version_minimum_lies_in_the_first_branches_of_its_major() -> None:
    assert MINOR_COMPAT_DRIVER == {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
    for major, minimum in MINOR_COMPAT_DRIVER.items():
        assert parse_version(TOOLKIT_DRIVER[(major, 0)]) <= parse_version(minimum) \
            < parse_version(TOOLKIT_DRIVER[(major, 1)])


def test_driver_cuda() -> None:
    assert driver_cuda("570.133.20") == (12, 8)
    assert driver_cuda("575.51.02") == (12, 8)
    assert driver_cuda("535.230.02") == (12, 2)
    assert driver_cuda("580.95.05") == (13, 0)
    assert driver_cuda("390.157") is None


def test_parse_version() -> None:
    assert parse_version("570.133.20") == (570, 133, 20)
    assert parse_version("12.8.1") == (12, 8, 1)
    for junk in ("", "abc", "12..8", "12.8-1", "v12.8", "N/A", "5 70"):
        with pytest.raises(ValueError, match="not a version"):
            parse_version(junk)


def test_requirement_semantics() -> None:
    def met(expression: str, driver: str = "535.230.02", cuda: tuple[int, int] = (12, 2),
            brand: str | None = "Tesla", arch: str | None = "9.0") -> bool:
        return requirement_met(expression, driver=driver, cuda=cuda, brand=brand, arch=arch)

    assert met("cuda>=12.8 brand=tesla,driver>=535,driver<536")
    assert not met("cuda>=12.8 brand=tesla,driver>=550,driver<551")
    assert not met("cuda>=12.8,brand=tesla")
    assert met("brand=TESLA") and not met("brand!=tesla") and not met("brand=tesla", brand=None)
    assert met("driver>=470.5", driver="470.10")
    assert met("driver<471", driver="470.256.02") and not met("driver=535", driver="535.1")
    assert met("arch>=9.0") and not met("arch>=9.0", arch="8.6") and not met("arch>=8", arch=None)
    assert met("cuda>12.1") and not met("cuda>12.2") and met("cuda<=12.2")
    assert met("") and met(" cuda>=12.0  ")


@pytest.mark.parametrize(("expression", "named"), [
    ("gpu>=1", "'gpu'"), ("cuda==12.8", "'=='"), ("cuda=>12.8", "'=>'"),
    ("brand>=tesla", "'>='"), ("cuda>=twelve", "'twelve'"), ("cuda>=", "no value"),
    ("12.8", "KEY OP VALUE"),
])
def test_a_malformed_requirement_raises_naming_it(expression: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        requirement_met(expression, driver="570.133.20", cuda=(12, 8), brand=None, arch=None)


def test_judge_raises_on_junk() -> None:
    with pytest.raises(ValueError):
        judge(image_cuda="12.8.1", require=None, disable_require=False, driver="latest",
              driver_cuda_version=None)
    with pytest.raises(ValueError):
        judge(image_cuda="twelve", require=None, disable_require=False, driver="570.133.20",
              driver_cuda_version=None)
    with pytest.raises(ValueError):
        judge(image_cuda=None, require="cuda>=12.8 brand~tesla", disable_require=False,
              driver="570.133.20", driver_cuda_version=None)
    with pytest.raises(ValueError):
        judge(image_cuda="12.8.1", require=None, disable_require=False, driver="570.133.20",
              driver_cuda_version="N/A")
