"""`wirespeed train`'s home: the shell that runs each backend in processes of its own (shell), one
rank's training steps and record (rank), the networks (nets), the what-if (whatif) and the
buckets' timeline (timeline). A workload that uses launch/, backends/, bench/ and explain/; cli/
only parses its flags and hands over."""
