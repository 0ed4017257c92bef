// SPDX-License-Identifier: GPL-2.0
/*
 * Dummy "nvidia" module for the rdmad lab: no GPU, just a module with the
 * real name so udev emits the same `module` add/remove events, plus one
 * exported symbol that the dummy nvidia-peermem uses to depend on it.
 */
#include <linux/module.h>

int nvidia_lab_dummy_ping(void)
{
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_lab_dummy_ping);

static int __init nvidia_lab_init(void)
{
	pr_info("nvidia (rdmad lab dummy) loaded\n");
	return 0;
}

static void __exit nvidia_lab_exit(void)
{
	pr_info("nvidia (rdmad lab dummy) unloaded\n");
}

module_init(nvidia_lab_init);
module_exit(nvidia_lab_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("rdmad lab dummy standing in for the NVIDIA GPU driver");
