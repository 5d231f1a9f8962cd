/*
 * The hook interpreter of pbs_server, for tests: one Python interpreter kept across hook runs and
 * restarted the way the server restarts it. OpenPBS 23.06, src/lib/Libpython/pbs_python_external.c:
 * pbs_python_ext_start_interpreter() sets Py_NoSiteFlag, Py_FrozenFlag, Py_OptimizeFlag = 2 and
 * Py_IgnoreEnvironmentFlag, then Py_InitializeEx(); pbs_python_ext_shutdown_interpreter() calls
 * Py_Finalize(). The server does both when its resource definitions change ("Restarting Python
 * interpreter as resourcedef file has changed") -- which `qmgr -c "create resource ..."` causes.
 * A C extension module that cannot live through Py_Finalize + Py_Initialize (pyyaml's _yaml:
 * "metaclass conflict") breaks every later hook run, and only an interpreter restart shows it.
 *
 * Usage: tether-pbs-interpreter ROUNDS DRIVER [ARG...]
 * Each round starts the interpreter as pbs_server does, runs DRIVER (Python) with
 * sys.argv = [DRIVER, ROUND, ARG...] and finalizes the interpreter. Exit status: 0, or 1 when a
 * round's driver raised (its traceback on stderr), 2 on bad usage.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>

static int run_round(int round, int argc, char **argv)
{
	PyConfig config;
	PyStatus status;
	char number[16];
	wchar_t **wargs;
	int rc = 1;

	PyConfig_InitPythonConfig(&config);
	config.site_import = 0;          /* Py_NoSiteFlag */
	config.optimization_level = 2;   /* Py_OptimizeFlag = 2: asserts and docstrings gone */
	config.use_environment = 0;      /* Py_IgnoreEnvironmentFlag */
	config.install_signal_handlers = 0;
	config.parse_argv = 0;
	config.write_bytecode = 0;
	snprintf(number, sizeof(number), "%d", round);
	wargs = calloc((size_t)argc + 2, sizeof(*wargs));
	if (wargs == NULL)
		return 1;
	wargs[0] = Py_DecodeLocale(argv[0], NULL);
	wargs[1] = Py_DecodeLocale(number, NULL);
	for (int i = 1; i < argc; i++)
		wargs[i + 1] = Py_DecodeLocale(argv[i], NULL);
	status = PyConfig_SetArgv(&config, argc + 1, wargs);
	for (int i = 0; i <= argc; i++)
		PyMem_RawFree(wargs[i]);
	free(wargs);
	if (!PyStatus_Exception(status))
		status = Py_InitializeFromConfig(&config);
	PyConfig_Clear(&config);
	if (PyStatus_Exception(status)) {
		fprintf(stderr, "tether-pbs-interpreter: cannot start Python: %s\n",
			status.err_msg ? status.err_msg : "unknown error");
		return 1;
	}
	FILE *fp = fopen(argv[0], "r");
	if (fp == NULL) {
		perror(argv[0]);
	} else {
		rc = PyRun_SimpleFileExFlags(fp, argv[0], 1, NULL) == 0 ? 0 : 1;
	}
	if (Py_FinalizeEx() < 0)
		rc = 1;
	return rc;
}

int main(int argc, char **argv)
{
	int rounds, failed = 0;

	if (argc < 3 || (rounds = atoi(argv[1])) < 1) {
		fprintf(stderr, "usage: %s ROUNDS DRIVER [ARG...]\n", argv[0]);
		return 2;
	}
	for (int round = 0; round < rounds; round++)
		failed |= run_round(round, argc - 2, argv + 2);
	return failed ? 1 : 0;
}
