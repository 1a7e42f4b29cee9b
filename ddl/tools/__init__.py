"""The command-line tools: ddlrun (ddlrun), ddl-bench (bench), ddl-topo (topo), ddl-cluster (cluster). Each
answers bad input with one line and exit status 2."""
