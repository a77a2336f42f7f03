"""Process groups of one layout, named by axis.

The device mesh is ``(dp, pp, cp, tp)`` outermost first, the planner's
``DEFAULT_MESH_ORDER`` (tp innermost) with the axes of degree 1 left out. Two groups get
their own communicator even when their ranks coincide with a mesh axis, so that every
byte is attributed to the axis the planner charges it to: the data-parallel gradient
group of a CP layout (dp·cp ranks, the planner's ZeRO group) and the expert-parallel
group (carved out of dp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from planner.api import Layout

MESH_AXES = ("dp", "pp", "cp", "tp")


@dataclass
class Groups:
    """This rank's place in the layout: the mesh, its groups by axis and their names."""

    layout: Layout
    mesh: DeviceMesh | None
    groups: dict[str, dist.ProcessGroup] = field(default_factory=dict)
    axis_of_group: dict[str, str] = field(default_factory=dict)

    def size(self, axis: str) -> int:
        return getattr(self.layout, axis)

    def coordinate(self, axis: str) -> int:
        """This rank's index along ``axis`` (0 when the axis has degree 1)."""
        if self.mesh is None or axis not in (self.mesh.mesh_dim_names or ()):
            return 0
        return self.mesh.get_local_rank(axis)

    def group(self, axis: str) -> dist.ProcessGroup | None:
        return self.groups.get(axis)

    def submesh(self, *axes: str) -> DeviceMesh:
        return self.mesh[axes if len(axes) > 1 else axes[0]]


def build_groups(layout: Layout, device_type: str) -> Groups:
    """The mesh of ``layout`` over the initialised default group, and its groups by axis."""
    axes = [axis for axis in MESH_AXES if getattr(layout, axis) > 1]
    if not axes:
        return Groups(layout=layout, mesh=None)
    mesh = init_device_mesh(
        device_type, tuple(getattr(layout, axis) for axis in axes), mesh_dim_names=tuple(axes)
    )
    result = Groups(layout=layout, mesh=mesh)
    for axis in axes:
        group = mesh.get_group(axis)
        result.groups[axis] = group
        result.axis_of_group[group.group_name] = axis
    if layout.cp > 1:
        # The gradient group of a CP layout spans dp·cp; give it its own communicator.
        data_axes = tuple(axis for axis in ("dp", "cp") if axis in axes)
        ranks = _groups_along(mesh, data_axes)
        result.groups["dp"] = _new_group_containing(ranks)
        result.axis_of_group[result.groups["dp"].group_name] = "dp"
    if layout.cp > 1 and layout.cp_algorithm == "hierarchical":
        # hierarchical CP's inner all-to-all groups and outer rings, charged to cp
        from validate.workloads.hierarchical_attention import inner_and_outer_ranks

        split = [inner_and_outer_ranks(ranks, layout.cp_inner)
                 for ranks in _groups_along(mesh, ("cp",))]  # fmt: skip
        for name, part in (("cp_inner", 0), ("cp_outer", 1)):
            result.groups[name] = _new_group_containing([g for s in split for g in s[part]])
            result.axis_of_group[result.groups[name].group_name] = "cp"
    if layout.ep > 1:
        ranks = _groups_along(mesh, ("dp",))
        result.groups["ep"] = _new_group_containing(ranks)
        result.axis_of_group[result.groups["ep"].group_name] = "ep"
    return result


def _groups_along(mesh: DeviceMesh, axes: tuple[str, ...]) -> list[list[int]]:
    """Every group of global ranks that varies only along ``axes`` of ``mesh``."""
    names = list(mesh.mesh_dim_names)
    tensor = mesh.mesh.permute(
        [names.index(a) for a in names if a not in axes] + [names.index(a) for a in axes]
    )
    size = 1
    for axis in axes:
        size *= mesh.size(names.index(axis))
    return tensor.reshape(-1, size).tolist()


def _new_group_containing(all_ranks: list[list[int]]) -> dist.ProcessGroup:
    """Create every group (all ranks must call ``new_group`` for each) and keep this rank's."""
    mine = None
    for ranks in all_ranks:
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine
