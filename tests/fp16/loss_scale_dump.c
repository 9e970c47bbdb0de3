/* The loss scaler (framework/train/loss_scale.c) as a filter, for tests/fp16/loss_scale_ref.py: each stdin
 * line is "dynamic POWER WINDOW HYSTERESIS MIN_SCALE CONSECUTIVE OUTCOMES" or "static SCALE HYSTERESIS
 * OUTCOMES", OUTCOMES a string of 0 (good step) and 1 (overflow); each output line is the scale after
 * every step and the step's flags ("scale:flags ..."). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/loss_scale.h"

int main(void)
{
    char line[8192], kind[16], outcomes[4096];
    while (fgets(line, sizeof line, stdin)) {
        zt_loss_scaler s;
        long long power, window, hysteresis;
        double min_scale, scale;
        int consecutive;
        if (sscanf(line, "dynamic %lld %lld %lld %lf %d %4095s", &power, &window, &hysteresis, &min_scale,
                   &consecutive, outcomes) == 6) {
            zt_loss_scaler_init(&s, power, window, hysteresis, min_scale);
            s.consecutive_hysteresis = consecutive;
        } else if (sscanf(line, "static %lf %lld %4095s", &scale, &hysteresis, outcomes) == 3) {
            zt_loss_scaler_init_static(&s, scale, hysteresis);
        } else {
            (void)kind;
            fprintf(stderr, "loss_scale_dump: cannot read the line: %s", line);
            return 2;
        }
        for (const char *o = outcomes; *o; o++) {
            unsigned flags = zt_loss_scaler_update(&s, *o == '1');
            printf("%s%.17g:%u", o == outcomes ? "" : " ", s.scale, flags);
        }
        printf("\n");
    }
    return 0;
}
