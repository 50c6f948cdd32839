"""Storage a sandbox mounts beyond its image: disks (sparse ext4 images on loop devices).

`disks.Disks` is the interface, `disks.DockerDisks` the engine's implementation, `disk_tool`
the privileged tool container's fixed script and document.
"""
