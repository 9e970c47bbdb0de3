/* A loadable library without zt's MPI entry: what ZT_COMM_MPI_LIBRARY pointing at the wrong file
 * gives (test_launch.c checks the message). */
int zt_comm_test_not_a_backend(void);
int zt_comm_test_not_a_backend(void) { return 0; }
