from sandboxd_client import Output
from sandboxd_client.sync import SandboxClient

with SandboxClient() as client, client.create_session(allow=["sh", "ls"]) as sandbox:
    for event in sandbox.exec(["sh", "-c", "echo hello sandbox"]):  # output as it comes
        if isinstance(event, Output):
            print(event.data.decode(), end="")
    sandbox.write_file("notes/hi.txt", b"hi\n", make_parents=True)
    print(sandbox.read_file("notes/hi.txt").decode(), end="")
    sandbox.upload_dir("project", "project")  # ./project, into the workspace
    print(sandbox.run(["ls", "project"]).stdout.decode(), end="")
