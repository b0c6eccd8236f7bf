"""Starting ranks on their hosts and supervising them: jobs, processes, the supervisor."""
