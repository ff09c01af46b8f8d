"""Process mesh: pure rank math (:mod:`layout`) and torch process groups (:mod:`mesh`)."""

from paracube.mesh.layout import MeshLayout

__all__ = ["MeshLayout"]
