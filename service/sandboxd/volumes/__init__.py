"""Named volumes: disks of a tenant that outlive sessions (VolumeService), mounted by
CreateSession. `checks` (pure validation), `store` (records), `port` (the disk mechanism the
domain asks for), `claims` (who mounts what, one writer at a time), `service` (the API's
domain), `porting` (export and import through a short-lived sandbox)."""
