// How the client names the services and RPCs of the .proto files; shared by the client and
// by scripts/gen-types.mjs, so the generated declarations always match what the client builds.

const PROPERTY = {
  FilesystemService: 'files',
  ProcessService: 'processes',
  AdminService: 'admin',
  AuditService: 'audit',
};

/** The SandboxClient property of a service: SessionService -> sessions, FilesystemService -> files. */
export function serviceProperty(serviceName) {
  if (PROPERTY[serviceName]) return PROPERTY[serviceName];
  const base = serviceName.replace(/Service$/, '');
  const lower = base[0].toLowerCase() + base.slice(1);
  return lower.endsWith('s') ? lower : `${lower}s`;
}

/** The method name of an RPC: CreateSession -> createSession. */
export function methodName(rpcName) {
  return rpcName[0].toLowerCase() + rpcName.slice(1);
}

/**
 * RPCs that are safe to send twice: reads, and writes whose second application changes
 * nothing. Only these (and the conditional ones below) are ever retried; an RPC not listed,
 * including one added to the protos later, is never retried.
 */
export const IDEMPOTENT = new Set([
  'sandboxd.v1.SessionService/GetSession',
  'sandboxd.v1.SessionService/ListSessions',
  'sandboxd.v1.SessionService/RenewLease',
  'sandboxd.v1.SessionService/DeleteSession',
  'sandboxd.v1.SessionService/UpdateNetworkPolicy',
  'sandboxd.v1.SessionService/ListEgressEvents',
  'sandboxd.v1.FilesystemService/ReadFile',
  'sandboxd.v1.FilesystemService/WriteFile',
  'sandboxd.v1.FilesystemService/ListDir',
  'sandboxd.v1.FilesystemService/Stat',
  'sandboxd.v1.ProcessService/AttachProcess',
  'sandboxd.v1.ProcessService/ListProcesses',
  'sandboxd.v1.ProcessService/GetProcess',
  'sandboxd.v1.ProcessService/CloseProcessStdin',
  'sandboxd.v1.SnapshotService/ExportArchive',
  'sandboxd.v1.SnapshotService/GetSnapshot',
  'sandboxd.v1.SnapshotService/ListSnapshots',
  'sandboxd.v1.SnapshotService/DeleteSnapshot',
  'sandboxd.v1.SnapshotService/DownloadSnapshot',
  'sandboxd.v1.AdminService/GetServerInfo',
  'sandboxd.v1.AdminService/Sweep',
  'sandboxd.v1.AuditService/ListAuditEvents',
  'sandboxd.v1.SessionService/GetSessionStats',
  'sandboxd.v1.AdminService/ListImages',
  'sandboxd.v1.TemplateService/GetTemplate',
  'sandboxd.v1.TemplateService/ListTemplates',
  'sandboxd.v1.TemplateService/DeleteTemplate',
  'sandboxd.v1.VolumeService/GetVolume',
  'sandboxd.v1.VolumeService/ListVolumes',
  'sandboxd.v1.VolumeService/DeleteVolume',
  'sandboxd.v1.SessionService/ListPorts',
]);

/** RPCs that are idempotent when the caller chose the id: the request field (camelCase) that names it. */
export const IDEMPOTENT_WITH_ID = {
  'sandboxd.v1.SessionService/CreateSession': 'sessionId',
  'sandboxd.v1.ProcessService/StartProcess': 'processId',
  'sandboxd.v1.VolumeService/CreateVolume': 'volumeId',
};
